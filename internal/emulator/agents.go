package emulator

import (
	"bufio"
	"encoding/json"
	"net/http"
	"sync"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/request"
)

// The agents' APIs, as vLLM serves them: OpenAI's Responses API
// (/v1/responses, with its response store: a response kept in this
// engine's memory, which only a request to this engine can continue) and
// Anthropic's Messages API (/v1/messages). Both run on the engine model
// exactly as a chat request: the prompt is request.Parse's rendering, a
// Responses request's with the stored conversation it continues.

// MaxStored bounds the responses an engine keeps; the oldest goes first.
// vLLM's store is unbounded (VLLM_ENABLE_RESPONSES_API_STORE warns of the
// leak); an emulator that runs for hours must not grow without end.
const MaxStored = 8192

// storedResponse is a response kept for previous_response_id.
type storedResponse struct {
	// history is the conversation a continuation inserts after its
	// instructions: the request's messages and this answer, rendered.
	history string
	// object is the response as answered, input its request's input.
	object []byte
	input  json.RawMessage
}

// responseStore is an engine's stored responses, bounded, oldest out.
type responseStore struct {
	mu    sync.Mutex
	m     map[string]*storedResponse
	order []string
}

func (st *responseStore) get(id string) *storedResponse {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.m[id]
}

func (st *responseStore) put(id string, r *storedResponse) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.m == nil {
		st.m = make(map[string]*storedResponse)
	}
	for len(st.order) >= MaxStored {
		delete(st.m, st.order[0])
		st.order = st.order[1:]
	}
	st.m[id] = r
	st.order = append(st.order, id)
}

func (st *responseStore) remove(id string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	_, ok := st.m[id]
	delete(st.m, id)
	return ok
}

// writeNotFound is vLLM's answer for a response id it does not hold.
func writeNotFound(w http.ResponseWriter, id string) { openai.ResponseNotFound(id).Write(w) }

// storedRoutes serves the stored responses: GET, DELETE, cancel and
// input_items.
func (s *Server) storedRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /v1/responses/{id}", func(w http.ResponseWriter, r *http.Request) {
		if st := s.stored.get(r.PathValue("id")); st != nil {
			writeRaw(w, st.object)
			return
		}
		writeNotFound(w, r.PathValue("id"))
	})
	mux.HandleFunc("DELETE /v1/responses/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if !s.stored.remove(id) {
			writeNotFound(w, id)
			return
		}
		writeJSON(w, map[string]any{"id": id, "object": "response", "deleted": true})
	})
	mux.HandleFunc("POST /v1/responses/{id}/cancel", func(w http.ResponseWriter, r *http.Request) {
		if s.stored.get(r.PathValue("id")) == nil {
			writeNotFound(w, r.PathValue("id"))
			return
		}
		// Every response here is answered synchronously (vLLM's words
		// for cancelling one).
		writeVLLMError(w, http.StatusBadRequest, openai.TypeInvalidRequest, "Cannot cancel a synchronous response.")
	})
	mux.HandleFunc("GET /v1/responses/{id}/input_items", func(w http.ResponseWriter, r *http.Request) {
		st := s.stored.get(r.PathValue("id"))
		if st == nil {
			writeNotFound(w, r.PathValue("id"))
			return
		}
		items := []any{}
		var text string
		if json.Unmarshal(st.input, &text) == nil {
			items = []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": text}}}}
		} else {
			_ = json.Unmarshal(st.input, &items)
		}
		writeJSON(w, map[string]any{"object": "list", "data": items, "has_more": false})
	})
}

func writeRaw(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// countTokens serves /v1/messages/count_tokens: the prompt's tokens as
// the engine counts them.
func (s *Server) countTokens(w http.ResponseWriter, hr *http.Request) {
	body, ok := readBody(w, hr, request.Messages)
	if !ok {
		return
	}
	v, ok := s.parse(w, request.Messages, body, request.Options{CountOnly: true})
	if !ok {
		return
	}
	writeJSON(w, map[string]int{"input_tokens": engine.Tokens(v.Prompt)})
}

// agent answers a Responses or Messages request, streamed or not.
func (rs *response) agent(w http.ResponseWriter, hr *http.Request, body []byte, id string) {
	if rs.v.Kind == request.Messages {
		rs.head.ID = "msg_" + id
		if rs.v.Stream {
			rs.events(w, hr, &messagesStream{rs: rs})
			return
		}
		if rs.waitAll(w, hr) {
			writeJSON(w, rs.messagesObject(string(rs.text())))
		}
		return
	}
	rs.head.ID = "resp_" + id
	if rs.v.Stream {
		rs.events(w, hr, &responsesStream{rs: rs, body: body})
		return
	}
	if !rs.waitAll(w, hr) {
		return
	}
	obj := rs.responseObject(string(rs.text()))
	b, _ := json.Marshal(obj)
	rs.store(obj, b, body)
	writeRaw(w, b)
}

// store keeps a finished response if its request asked to.
func (rs *response) store(obj *openai.ResponseObject, b, body []byte) {
	if !rs.v.Store {
		return
	}
	var probe struct {
		Input json.RawMessage `json:"input"`
	}
	_ = json.Unmarshal(body, &probe)
	text := ""
	if len(obj.Output) > 0 {
		text = obj.Output[0].Content[0].Text
	}
	rs.s.stored.put(obj.ID, &storedResponse{
		history: rs.prompt[rs.v.MessagesAt:] + text + "\n",
		object:  b, input: probe.Input,
	})
}

// responseObject is the Responses answer of text, finished.
func (rs *response) responseObject(text string) *openai.ResponseObject {
	obj := rs.responseHead("completed")
	obj.Output = []openai.ResponseItem{rs.item("completed", text)}
	if rs.finish == finishLength {
		obj.Status = "incomplete"
		obj.IncompleteDetails = &openai.IncompleteInfo{Reason: "max_output_tokens"}
	}
	u := rs.usage()
	obj.Usage = &openai.ResponseUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens,
		InputTokensDetails: openai.ResponseInputUsage{CachedTokens: u.PromptTokensDetails.CachedTokens}}
	return obj
}

func (rs *response) responseHead(status string) *openai.ResponseObject {
	obj := &openai.ResponseObject{ID: rs.head.ID, Object: "response", CreatedAt: rs.head.Created, Model: rs.head.Model,
		Status: status, Output: []openai.ResponseItem{}, Store: rs.v.Store, Background: rs.v.Background}
	if rs.v.PreviousResponseID != "" {
		obj.PreviousResponseID = &rs.v.PreviousResponseID
	}
	if rs.v.MaxTokens > 0 {
		obj.MaxOutputTokens = &rs.v.MaxTokens
	}
	return obj
}

func (rs *response) item(status, text string) openai.ResponseItem {
	it := openai.ResponseItem{ID: "msg_" + rs.head.ID[len("resp_"):], Type: "message", Role: "assistant", Status: status,
		Content: []openai.ContentPart{}}
	if status == "completed" {
		it.Content = append(it.Content, openai.ContentPart{Type: "output_text", Text: text, Annotations: []any{}})
	}
	return it
}

// messagesObject is the Messages answer of text, finished.
func (rs *response) messagesObject(text string) *openai.MessagesResponse {
	stop := rs.stopReason()
	m := rs.messagesHead()
	m.Content, m.StopReason, m.Usage = []openai.MessageBlock{{Type: "text", Text: text}}, &stop, rs.messagesUsage()
	return m
}

// messagesHead is the Messages answer before its first token.
func (rs *response) messagesHead() *openai.MessagesResponse {
	return &openai.MessagesResponse{ID: rs.head.ID, Type: "message", Role: "assistant", Model: rs.head.Model,
		Content: []openai.MessageBlock{}}
}

// messagesUsage is the usage of a finished request.
func (rs *response) messagesUsage() openai.MessagesUsage {
	u := rs.usage()
	return openai.MessagesUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, CacheReadInputTokens: u.PromptTokensDetails.CachedTokens}
}

func (rs *response) stopReason() string {
	if rs.finish == finishLength {
		return "max_tokens"
	}
	return "end_turn"
}

// eventStream writes a streamed answer's named server-sent events.
type eventStream interface {
	// start is written when the stream opens, first before the first
	// token, token for each token, end when the request is finished.
	start(e *sse)
	first(e *sse)
	token(e *sse, tok string)
	end(e *sse)
}

// sse writes named events: "event: name\ndata: json\n\n".
type sse struct {
	bw  *bufio.Writer
	enc *json.Encoder
}

func (e *sse) event(name string, v any) {
	e.bw.WriteString("event: ")
	e.bw.WriteString(name)
	e.bw.WriteString("\ndata: ")
	_ = e.enc.Encode(v) // appends '\n'
	e.bw.WriteByte('\n')
}

// events streams the answer through es as the engine delivers tokens.
func (rs *response) events(w http.ResponseWriter, hr *http.Request, es eventStream) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	bw := bufio.NewWriterSize(w, 4096)
	e := &sse{bw: bw, enc: json.NewEncoder(bw)}
	e.enc.SetEscapeHTML(false)
	// The created event goes out at once, as vLLM's does; the rest waits
	// for the tokens.
	es.start(e)
	if bw.Flush() != nil || rc.Flush() != nil {
		return
	}
	sent := 0
	for {
		n, fin, ok := rs.wait(hr)
		if !ok {
			return
		}
		if sent == 0 && (n > 0 || fin) {
			es.first(e)
		}
		for ; sent < n; sent++ {
			es.token(e, tokenText(rs.seed, sent))
		}
		if fin {
			es.end(e)
		}
		if bw.Flush() != nil || rc.Flush() != nil || fin {
			return
		}
	}
}

// responsesStream is a streamed Responses answer, as vLLM emits it:
// response.created, response.in_progress, response.output_item.added,
// response.content_part.added, a response.output_text.delta per token,
// then response.output_text.done, response.content_part.done,
// response.output_item.done and response.completed with the usage.
type responsesStream struct {
	rs   *response
	body []byte
	seq  int
	text []byte
}

func (st *responsesStream) ev(e *sse, ev openai.ResponseEvent) {
	ev.SequenceNumber = st.seq
	st.seq++
	e.event(ev.Type, &ev)
}

func (st *responsesStream) start(e *sse) {
	st.ev(e, openai.ResponseEvent{Type: "response.created", Response: st.rs.responseHead("in_progress")})
	st.ev(e, openai.ResponseEvent{Type: "response.in_progress", Response: st.rs.responseHead("in_progress")})
}

var zero = 0

func (st *responsesStream) first(e *sse) {
	it := st.rs.item("in_progress", "")
	st.ev(e, openai.ResponseEvent{Type: "response.output_item.added", OutputIndex: &zero, Item: &it})
	st.ev(e, openai.ResponseEvent{Type: "response.content_part.added", OutputIndex: &zero, ContentIndex: &zero, ItemID: it.ID,
		Part: &openai.ContentPart{Type: "output_text", Annotations: []any{}}})
}

func (st *responsesStream) token(e *sse, tok string) {
	st.text = append(st.text, tok...)
	st.ev(e, openai.ResponseEvent{Type: "response.output_text.delta", OutputIndex: &zero, ContentIndex: &zero,
		ItemID: st.rs.item("", "").ID, Delta: &tok})
}

func (st *responsesStream) end(e *sse) {
	text := string(st.text)
	obj := st.rs.responseObject(text)
	it := obj.Output[0]
	st.ev(e, openai.ResponseEvent{Type: "response.output_text.done", OutputIndex: &zero, ContentIndex: &zero, ItemID: it.ID, Text: &text})
	st.ev(e, openai.ResponseEvent{Type: "response.content_part.done", OutputIndex: &zero, ContentIndex: &zero, ItemID: it.ID, Part: &it.Content[0]})
	st.ev(e, openai.ResponseEvent{Type: "response.output_item.done", OutputIndex: &zero, Item: &it})
	b, _ := json.Marshal(obj)
	st.rs.store(obj, b, st.body)
	st.ev(e, openai.ResponseEvent{Type: "response.completed", Response: obj})
}

// messagesStream is a streamed Messages answer, as Anthropic's API (and
// vLLM's) emits it: message_start (with the input's usage),
// content_block_start, a content_block_delta per token,
// content_block_stop, message_delta (stop reason and usage), message_stop.
type messagesStream struct{ rs *response }

func (st *messagesStream) start(e *sse) {
	e.event("message_start", &openai.MessagesEvent{Type: "message_start", Message: st.rs.messagesHead()})
}

func (st *messagesStream) first(e *sse) {
	e.event("content_block_start", &openai.MessagesEvent{Type: "content_block_start", Index: &zero,
		ContentBlock: &openai.MessageBlock{Type: "text"}})
}

func (st *messagesStream) token(e *sse, tok string) {
	e.event("content_block_delta", &openai.MessagesEvent{Type: "content_block_delta", Index: &zero,
		Delta: openai.TextDelta{Type: "text_delta", Text: tok}})
}

func (st *messagesStream) end(e *sse) {
	e.event("content_block_stop", &openai.MessagesEvent{Type: "content_block_stop", Index: &zero})
	u := st.rs.messagesUsage()
	e.event("message_delta", &openai.MessagesEvent{Type: "message_delta",
		Delta: openai.StopDelta{StopReason: st.rs.stopReason()}, Usage: &u})
	e.event("message_stop", &openai.MessagesEvent{Type: "message_stop"})
}
