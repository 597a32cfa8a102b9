package emulator

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute/internal/engine"
	"github.com/kvroute/kvroute/internal/openai"
	"github.com/kvroute/kvroute/internal/prefix"
	"github.com/kvroute/kvroute/internal/request"
)

// MaxBodyBytes bounds a request body; vLLM has no such limit but an
// emulator on a laptop should not be the thing that runs out of memory.
const MaxBodyBytes = 64 << 20

// vLLM's error types: it names them after the Python exception and puts
// the HTTP status in "code".
const (
	typeBadRequest = "BadRequestError"
	typeNotFound   = "NotFoundError"
)

// words are the output vocabulary: each exactly engine.BytesPerToken bytes,
// so that text sent back as a prompt re-tokenizes to the same count.
var words = [...]string{
	" the", " and", " for", " you", " are", " was", " not", " but",
	" all", " can", " her", " one", " our", " out", " day", " get",
	" has", " him", " his", " how", " man", " new", " now", " old",
	" see", " two", " way", " who", " boy", " did", " its", " let",
}

// tokenText is the text of output token i of a request with seed.
func tokenText(seed uint64, i int) string {
	return words[(seed+uint64(i))%uint64(len(words))]
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		s.complete(w, r, request.Chat)
	})
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, r *http.Request) {
		s.complete(w, r, request.Completion)
	})
	mux.HandleFunc("POST /v1/responses", func(w http.ResponseWriter, r *http.Request) {
		s.complete(w, r, request.Responses)
	})
	mux.HandleFunc("POST /v1/messages", func(w http.ResponseWriter, r *http.Request) {
		s.complete(w, r, request.Messages)
	})
	mux.HandleFunc("POST /v1/messages/count_tokens", s.countTokens)
	s.storedRoutes(mux)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("POST /tokenize", s.tokenize)
	mux.HandleFunc("POST /reset_prefix_cache", func(w http.ResponseWriter, _ *http.Request) {
		s.resetPrefixCache()
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	return mux
}

// writeVLLMError writes an error in the OpenAI shape with vLLM's type names
// and numeric code.
func writeVLLMError(w http.ResponseWriter, status int, typ, msg string) {
	b, _ := json.Marshal(openai.ErrorBody{Error: openai.ErrorDetail{Message: msg, Type: typ, Code: status}})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", s.modelCards(s.loraOrder)})
}

func writeJSON(w http.ResponseWriter, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeVLLMError(w, http.StatusInternalServerError, "InternalServerError", err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

// writeKindError writes an error in the shape of the endpoint of kind:
// Anthropic's on /v1/messages, vLLM's elsewhere.
func writeKindError(w http.ResponseWriter, kind request.Kind, status int, typ, msg string) {
	if kind == request.Messages {
		openai.WriteAnthropicError(w, status, msg, 0)
		return
	}
	writeVLLMError(w, status, typ, msg)
}

// readBody reads a request body of at most MaxBodyBytes, answering 400 when
// it cannot.
func readBody(w http.ResponseWriter, hr *http.Request, kind request.Kind) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, hr.Body, MaxBodyBytes))
	if err != nil {
		writeKindError(w, kind, http.StatusBadRequest, typeBadRequest, fmt.Sprintf("read request body: %v", err))
		return nil, false
	}
	return body, true
}

// parse reads a body of kind into its view, answering 400 for a bad body
// and 404 for another model (vLLM accepts a missing model as the served
// one).
func (s *Server) parse(w http.ResponseWriter, kind request.Kind, body []byte, opt request.Options) (*request.View, bool) {
	v, perr := request.Parse(kind, body, opt)
	if perr != nil {
		writeKindError(w, kind, perr.Status, typeBadRequest, perr.Message)
		return nil, false
	}
	if v.MaxTokens > 0 && v.MinTokens > v.MaxTokens {
		// vLLM's SamplingParams check, which a prefill leg's max_tokens of
		// 1 trips when a router keeps the client's min_tokens.
		writeKindError(w, kind, http.StatusBadRequest, typeBadRequest, fmt.Sprintf(
			"min_tokens must be less than or equal to max_tokens=%d, got %d.", v.MaxTokens, v.MinTokens))
		return nil, false
	}
	if _, adapter := s.loras[v.Model]; v.Model != "" && v.Model != s.model && !adapter {
		writeKindError(w, kind, http.StatusNotFound, typeNotFound, fmt.Sprintf("The model `%s` does not exist.", v.Model))
		return nil, false
	}
	return v, true
}

// tokenizeResponse is vLLM's TokenizeResponse.
type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

// tokenize serves vLLM's POST /tokenize: {"model", "prompt"} tokenizes the
// prompt as /v1/completions would, {"model", "messages", ...} the chat
// rendered as /v1/chat/completions renders it (request.Parse, the one
// renderer), with engine.TokenIDs, so that the ids the engine publishes in
// BlockStored are a prefix of these. return_token_strs adds each token's
// text.
func (s *Server) tokenize(w http.ResponseWriter, hr *http.Request) {
	body, ok := readBody(w, hr, request.Completion)
	if !ok {
		return
	}
	// Members are read as vLLM reads them (and request.Parse): a map's
	// exact keys, the last of a repeated key winning, not a struct's
	// case-insensitive fields.
	var probe map[string]json.RawMessage
	var returnStrs bool
	err := json.Unmarshal(body, &probe)
	if raw := probe["return_token_strs"]; err == nil && raw != nil {
		err = json.Unmarshal(raw, &returnStrs)
	}
	if err != nil {
		writeVLLMError(w, http.StatusBadRequest, typeBadRequest, fmt.Sprintf("invalid JSON body: %v", err))
		return
	}
	kind := request.Completion
	if m := probe["messages"]; m != nil && string(m) != "null" {
		// vLLM's chat form needs a list: null messages leave the
		// completion form, which ignores the member.
		kind = request.Chat
	}
	v, ok := s.parse(w, kind, body, request.Options{})
	if !ok {
		return
	}
	ids := engine.TokenIDs(make([]uint32, 0, engine.Tokens(v.Prompt)), v.Prompt)
	resp := tokenizeResponse{Count: len(ids), MaxModelLen: s.Preset().MaxModelLen, Tokens: ids}
	if returnStrs {
		resp.TokenStrs = make([]string, len(ids))
		for i := range ids {
			resp.TokenStrs[i] = v.Prompt[i*engine.BytesPerToken : min((i+1)*engine.BytesPerToken, len(v.Prompt))]
		}
	}
	writeJSON(w, resp)
}

// complete serves the completion endpoints, chat, Responses and Messages.
func (s *Server) complete(w http.ResponseWriter, hr *http.Request, kind request.Kind) {
	body, ok := readBody(w, hr, kind)
	if !ok {
		return
	}
	v, ok := s.parse(w, kind, body, request.Options{})
	if !ok {
		return
	}
	prompt := v.Prompt
	if kind == request.Responses && v.PreviousResponseID != "" {
		// Only this engine's own stored responses continue (vLLM's
		// response store is the server's memory).
		prev := s.stored.get(v.PreviousResponseID)
		if prev == nil {
			writeNotFound(w, v.PreviousResponseID)
			return
		}
		prompt = v.Prompt[:v.HistoryAt] + prev.history + v.Prompt[v.HistoryAt:]
	}
	kt, err := kvTransferOf(body)
	if err == nil {
		err = s.checkLeg(kt)
	}
	if err != nil {
		writeKindError(w, kind, http.StatusBadRequest, typeBadRequest, err.Error())
		return
	}
	preset := s.Preset()
	// seed picks the output tokens' words; the output length is the
	// engine's rule (SetOutput).
	seed := xxhash.Sum64String(prompt)
	promptTokens := engine.Tokens(prompt)
	p := &pending{notify: make(chan struct{}, 1)}
	adapter := ""
	if _, ok := s.loras[v.Model]; ok {
		adapter = v.Model
	}
	p.r = engine.Request{ID: s.nextID.Add(1), Prompt: prompt, Tag: p, Adapter: adapter,
		// Hashed here, outside the engine lock, so that a long prompt
		// does not hold up the driver.
		PromptHashes: prefix.HashSalted(nil, prompt, engine.BlockSize*engine.BytesPerToken, prefix.AdapterSalt(adapter, v.PrefixSalt)), CacheSalt: v.PrefixSalt}
	p.r.SetOutput(v.MaxTokens, v.MinTokens, v.IgnoreEOS, preset.MaxModelLen)
	if kind == request.Chat && v.Continues > 0 {
		seed = continueAnswer(&p.r, v, preset.MaxModelLen)
	}
	if kt.remotePrefill && kt.blocks < promptTokens/engine.BlockSize {
		writeVLLMError(w, http.StatusBadRequest, typeBadRequest, fmt.Sprintf(
			"%s.remote_block_ids names %d blocks; the prompt's %d full blocks of %d tokens need as many",
			kvParamsKey, kt.blocks, promptTokens/engine.BlockSize, engine.BlockSize))
		return
	}
	// A decode leg receives its prompt's KV cache; a prefill leg keeps
	// its blocks for the decode engine (kvtransfer.go).
	p.r.RemotePrefill = kt.remotePrefill
	p.r.HoldKV = kt.remoteDecode
	if kt.remoteDecode {
		p.r.HoldTimeout = s.holdFor(promptTokens)
	}
	n := p.r.OutputTokens
	finish := finishStop
	if v.IgnoreEOS || (v.MaxTokens > 0 && n >= v.MaxTokens) || n >= preset.MaxModelLen-promptTokens {
		finish = finishLength
	}
	p.finish = finish
	if err := s.add(p); err != nil {
		var ce *engine.ContextError
		if errors.As(err, &ce) {
			writeKindError(w, kind, http.StatusBadRequest, typeBadRequest, ce.Message)
			return
		}
		writeKindError(w, kind, http.StatusInternalServerError, "InternalServerError", err.Error())
		return
	}
	// Whatever happens to the client, the engine lets go of the request.
	defer s.abort(p)

	rs := &response{
		s: s, v: v, p: p, seed: seed, finish: finish, prefillLeg: kt.remoteDecode,
		head: openai.Response{Created: time.Now().Unix(), Model: cmp.Or(adapter, s.model)},
	}
	// A random id, as vLLM's (random_uuid().hex): unique across engines
	// and restarts, which the engine's request counter is not.
	id := fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
	switch kind {
	case request.Chat:
		rs.head.ID = "chatcmpl-" + id
	case request.Completion:
		rs.head.ID = "cmpl-" + id
	default:
		// The agents' APIs (agents.go).
		rs.prompt = prompt
		rs.agent(w, hr, body, id)
		return
	}
	if v.Stream {
		rs.stream(w, hr)
	} else {
		rs.whole(w, hr)
	}
}

// response writes one request's answer as its tokens are delivered.
type response struct {
	s      *Server
	v      *request.View
	p      *pending
	seed   uint64
	finish string
	head   openai.Response
	// prefillLeg: the answer carries the kv_transfer_params a decode
	// engine needs (kvtransfer.go).
	prefillLeg bool
	// prompt is the prompt the engine ran: a Responses request's with
	// the stored conversation it continues.
	prompt string
}

// wait blocks until the driver delivers something, and reports how many
// tokens are out and whether the request is finished; ok is false when the
// client left or the server is closing.
func (rs *response) wait(hr *http.Request) (n int, fin, ok bool) {
	select {
	case <-rs.p.notify:
	case <-hr.Context().Done():
		return 0, false, false
	case <-rs.s.done:
		return 0, false, false
	}
	fin = rs.p.finished.Load()
	return int(rs.p.delivered.Load()), fin, true
}

func (rs *response) usage() *openai.Usage {
	p := rs.p
	n := int(p.delivered.Load())
	return &openai.Usage{
		PromptTokens:        p.promptTokens,
		CompletionTokens:    n,
		TotalTokens:         p.promptTokens + n,
		PromptTokensDetails: &openai.PromptTokensDetails{CachedTokens: p.cachedTokens},
	}
}

// text is the text of the tokens delivered.
func (rs *response) text() []byte {
	n := int(rs.p.delivered.Load())
	text := make([]byte, 0, n*engine.BytesPerToken)
	for i := range n {
		text = append(text, tokenText(rs.seed, i)...)
	}
	return text
}

// waitAll waits until the request is finished; false when the client left
// or the server is closing (answered with a 503 then).
func (rs *response) waitAll(w http.ResponseWriter, hr *http.Request) bool {
	for {
		_, fin, ok := rs.wait(hr)
		if !ok {
			if hr.Context().Err() == nil {
				writeKindError(w, rs.v.Kind, http.StatusServiceUnavailable, "ServiceUnavailableError", "the server is shutting down")
			}
			return false
		}
		if fin {
			return true
		}
	}
}

// whole answers a non-streaming request once it is finished.
func (rs *response) whole(w http.ResponseWriter, hr *http.Request) {
	if !rs.waitAll(w, hr) {
		return
	}
	text := rs.text()
	out := rs.head
	finish := rs.finish
	c := openai.Choice{FinishReason: &finish}
	if rs.v.Kind == request.Chat {
		out.Object = "chat.completion"
		c.Message = &openai.Message{Role: "assistant", Content: string(text)}
	} else {
		out.Object = "text_completion"
		t := string(text)
		c.Text = &t
	}
	out.Choices = []openai.Choice{c}
	out.Usage = rs.usage()
	if rs.prefillLeg && rs.p.kvBlocks != nil {
		out.KVTransferParams = rs.s.kvAnswerFor(out.ID, rs.p.kvBlocks)
	}
	writeJSON(w, out)
}

// stream answers with server-sent events in vLLM's format: for chat, a
// first chunk with the assistant role, then one chunk per token, the last
// carrying finish_reason; with include_usage, a chunk with no choices and
// the usage; then [DONE].
func (rs *response) stream(w http.ResponseWriter, hr *http.Request) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	// Headers go out at once, as vLLM's do; the first data waits for the
	// first token.
	if rc.Flush() != nil {
		return
	}
	bw := bufio.NewWriterSize(w, 4096)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	chunk := rs.head
	if rs.v.Kind == request.Chat {
		chunk.Object = "chat.completion.chunk"
	} else {
		chunk.Object = "text_completion"
	}
	choices := make([]openai.Choice, 1)
	var delta openai.Message
	var text string
	emit := func(c openai.Choice) {
		choices[0] = c
		chunk.Choices = choices
		bw.WriteString("data: ")
		_ = enc.Encode(&chunk) // appends '\n'
		bw.WriteByte('\n')
	}
	pre, suf := rs.tokenChunk(chunk)
	sent := 0
	// The request finishes exactly at its last token, so that token's
	// chunk carries finish_reason even when the finish itself is seen only
	// at the next wake-up.
	last := rs.p.r.OutputTokens - 1
	for {
		n, fin, ok := rs.wait(hr)
		if !ok {
			return
		}
		if sent == 0 && n > 0 && rs.v.Kind == request.Chat {
			delta = openai.Message{Role: "assistant"}
			emit(openai.Choice{Delta: &delta})
		}
		for ; sent < n; sent++ {
			tok := tokenText(rs.seed, sent)
			if sent != last {
				// The hot path: every token but the last is the same
				// chunk around a different word.
				bw.Write(pre)
				bw.WriteString(tok)
				bw.Write(suf)
				continue
			}
			c := openai.Choice{FinishReason: &rs.finish}
			if rs.v.Kind == request.Chat {
				delta = openai.Message{Content: tok}
				c.Delta = &delta
			} else {
				text = tok
				c.Text = &text
			}
			emit(c)
		}
		if fin {
			if n == 0 {
				// Nothing generated: the finish still needs a chunk.
				c := openai.Choice{FinishReason: &rs.finish}
				if rs.v.Kind == request.Chat {
					delta = openai.Message{Role: "assistant"}
					c.Delta = &delta
				} else {
					text = ""
					c.Text = &text
				}
				emit(c)
			}
			if rs.v.IncludeUsage {
				chunk.Choices = []openai.Choice{}
				chunk.Usage = rs.usage()
				bw.WriteString("data: ")
				_ = enc.Encode(&chunk)
				bw.WriteByte('\n')
			}
			bw.WriteString("data: [DONE]\n\n")
		}
		if bw.Flush() != nil || rc.Flush() != nil {
			return
		}
		if fin {
			return
		}
	}
}

// tokenPlaceholder stands for the token text in the chunk template; it
// needs no JSON escaping and sorts after every other field of the chunk.
const tokenPlaceholder = "\x01TOKEN\x01"

// tokenChunk renders the SSE event of a token that does not finish the
// request as the bytes before and after the token's text: the words need
// no escaping, so streaming a token is two copies instead of a JSON
// encoding.
func (rs *response) tokenChunk(chunk openai.Response) (pre, suf []byte) {
	c := openai.Choice{}
	placeholder := tokenPlaceholder
	if rs.v.Kind == request.Chat {
		c.Delta = &openai.Message{Content: placeholder}
	} else {
		c.Text = &placeholder
	}
	chunk.Choices = []openai.Choice{c}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf) // as stream's encoder: no HTML escaping
	enc.SetEscapeHTML(false)
	_ = enc.Encode(&chunk)
	b := bytes.TrimSuffix(buf.Bytes(), []byte{'\n'})
	quoted, _ := json.Marshal(placeholder)
	inner := quoted[1 : len(quoted)-1]
	i := bytes.LastIndex(b, inner)
	pre = append([]byte("data: "), b[:i]...)
	suf = append(append([]byte{}, b[i+len(inner):]...), '\n', '\n')
	return pre, suf
}
