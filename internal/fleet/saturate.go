package fleet

import "math"

// SatAdd is a + b for counts of requests or tokens, saturating at
// math.MaxInt64 instead of wrapping negative; negative operands count as
// 0. Sums that take an engine's numbers (its queue, the work it holds)
// go through it and SatMul, so that no reading, however wrong, makes a
// busy backend look idle.
func SatAdd(a, b int64) int64 {
	a, b = max(a, 0), max(b, 0)
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// SatMul is a x b, saturating as SatAdd does.
func SatMul(a, b int64) int64 {
	a, b = max(a, 0), max(b, 0)
	if a != 0 && b > math.MaxInt64/a {
		return math.MaxInt64
	}
	return a * b
}
