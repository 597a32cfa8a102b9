package engine

// queue is the waiting queue: a ring buffer of requests that grows by
// doubling, with pushes at both ends (preempted requests go back to the
// front) and an O(n) removal for the rare abort of a waiting request.
type queue struct {
	buf  []*Request
	head int
	n    int
}

func (q *queue) len() int { return q.n }

func (q *queue) at(i int) *Request { return q.buf[(q.head+i)&(len(q.buf)-1)] }

func (q *queue) grow() {
	if q.n < len(q.buf) {
		return
	}
	size := 2 * len(q.buf)
	if size == 0 {
		size = 64
	}
	buf := make([]*Request, size)
	for i := range q.n {
		buf[i] = q.at(i)
	}
	q.buf, q.head = buf, 0
}

func (q *queue) pushBack(r *Request) {
	q.grow()
	q.buf[(q.head+q.n)&(len(q.buf)-1)] = r
	q.n++
}

func (q *queue) pushFront(r *Request) {
	q.grow()
	q.head = (q.head - 1) & (len(q.buf) - 1)
	q.buf[q.head] = r
	q.n++
}

func (q *queue) popFront() *Request {
	r := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) & (len(q.buf) - 1)
	q.n--
	return r
}

// removeAt deletes the i-th request, keeping the order of the others.
func (q *queue) removeAt(i int) {
	for j := i; j < q.n-1; j++ {
		q.buf[(q.head+j)&(len(q.buf)-1)] = q.at(j + 1)
	}
	q.buf[(q.head+q.n-1)&(len(q.buf)-1)] = nil
	q.n--
}

// remove deletes r, keeping the order of the others; it reports whether r
// was queued.
func (q *queue) remove(r *Request) bool {
	for i := range q.n {
		if q.at(i) != r {
			continue
		}
		q.removeAt(i)
		return true
	}
	return false
}
