package request

import (
	"bytes"
	"errors"
	"io"
	"mime"
	"mime/multipart"

	"github.com/kvroute/kvroute/internal/openai"
)

// maxFormModel bounds the model field read from a form.
const maxFormModel = 1 << 10

// ModelOf returns the model that the body of a request to another
// endpoint than the two completions (embeddings, rerank, audio...) names,
// so that it is routed to the backends that serve it, matched as
// completions are: the top-level "model" string of a JSON object (the
// same field rules as Parse; other members are validated and passed
// over), or the "model" field of a multipart/form-data body (the audio
// endpoints). An empty body names no model. Errors are 400s in the OpenAI
// shape.
func ModelOf(contentType string, body []byte) (string, *openai.Error) {
	if len(trimSpace(body)) == 0 {
		return "", nil
	}
	if mt, params, err := mime.ParseMediaType(contentType); err == nil && mt == "multipart/form-data" {
		return formModel(body, params["boundary"])
	}
	body = trimSpace(body)
	if body[0] != '{' {
		return "", openai.BadRequest("invalid_json", "request body must be a JSON object")
	}
	if len(body) > maxBody {
		return "", openai.BadRequest("invalid_json", "request body is too large")
	}
	d := decoders.Get().(*decoder)
	defer d.release()
	d.reset(Chat, body, Options{})
	ok := d.members(func(key []byte) bool {
		if field(key, bodyFields[fModel:fModel+1]) == 0 {
			return d.optStr(&d.model, "model")
		}
		return d.skip()
	})
	if ok {
		if d.space(); d.pos < len(body) {
			ok = d.unexpected("the end of the body after the object")
		}
	}
	if !ok {
		return "", openai.BadRequest("invalid_json", "malformed request body: "+d.err.Error())
	}
	return string(d.bytes(d.model)), nil
}

// formModel reads the model field of a multipart form, passing over the
// other parts (an audio file) without keeping them.
func formModel(body []byte, boundary string) (string, *openai.Error) {
	if boundary == "" {
		return "", openai.BadRequest("invalid_form", "multipart/form-data without a boundary")
	}
	mr := multipart.NewReader(bytes.NewReader(body), boundary)
	model := ""
	for {
		p, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			return model, nil
		}
		if err != nil {
			return "", openai.BadRequest("invalid_form", "malformed multipart body: "+err.Error())
		}
		if p.FormName() == "model" && p.FileName() == "" {
			b, err := io.ReadAll(io.LimitReader(p, maxFormModel+1))
			if err != nil || len(b) > maxFormModel {
				return "", openai.BadRequest("invalid_form", "malformed model field")
			}
			model = string(b)
		}
	}
}
