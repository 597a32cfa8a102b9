package engine

// TokenIDs appends the token ids of text to dst and returns it: the
// engine's tokenizer cuts text into tokens of BytesPerToken (4) bytes, and a
// token's id is its 4 bytes read as a little-endian uint32; a short last
// token is padded with zero bytes. len(TokenIDs(nil, s)) == Tokens(s), and
// the ids of a text's prefix whose length is a multiple of 4 are a prefix of
// the text's ids, so the ids the engine reports in its BlockStored events
// (whole 64-byte blocks) are a prefix of what /tokenize returns for the
// same prompt.
func TokenIDs(dst []uint32, text string) []uint32 {
	for len(text) >= BytesPerToken {
		dst = append(dst, uint32(text[0])|uint32(text[1])<<8|uint32(text[2])<<16|uint32(text[3])<<24)
		text = text[BytesPerToken:]
	}
	if len(text) > 0 {
		var id uint32
		for i := len(text) - 1; i >= 0; i-- {
			id = id<<8 | uint32(text[i])
		}
		dst = append(dst, id)
	}
	return dst
}
