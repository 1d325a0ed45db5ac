package api

// OpenAI's log-probability objects: chat's {content: [...]} and the
// legacy completions' parallel arrays.

type chatLogprobs struct {
	Content []chatTokenLogprob `json:"content"`
	Refusal any                `json:"refusal"`
}

type chatTokenLogprob struct {
	Token       string           `json:"token"`
	Logprob     float32          `json:"logprob"`
	Bytes       []int            `json:"bytes"`
	TopLogprobs []chatTopLogprob `json:"top_logprobs"`
}

type chatTopLogprob struct {
	Token   string  `json:"token"`
	Logprob float32 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float32            `json:"token_logprobs"`
	TopLogprobs   []map[string]float32 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// byteInts is OpenAI's "bytes": the token's bytes as integers (a token
// may hold part of a UTF-8 character).
func byteInts(b []byte) []int {
	out := make([]int, len(b))
	for i, c := range b {
		out[i] = int(c)
	}
	return out
}

// logprobsOut is a choice's logprobs for lps (nil, JSON null, when the
// request did not ask for them); offset is the text length before them.
func logprobsOut(req *request, lps []TokenLogprob, offset int) any {
	if !req.gen.Logprobs {
		return nil
	}
	if req.chat {
		out := chatLogprobs{Content: make([]chatTokenLogprob, len(lps))}
		for i, lp := range lps {
			t := chatTokenLogprob{Token: lp.Token, Logprob: lp.Logprob, Bytes: byteInts(lp.Bytes), TopLogprobs: make([]chatTopLogprob, len(lp.Top))}
			for j, a := range lp.Top {
				t.TopLogprobs[j] = chatTopLogprob{Token: a.Token, Logprob: a.Logprob, Bytes: byteInts(a.Bytes)}
			}
			out.Content[i] = t
		}
		return out
	}
	out := completionLogprobs{Tokens: []string{}, TokenLogprobs: []float32{}, TopLogprobs: []map[string]float32{}, TextOffset: []int{}}
	for _, lp := range lps {
		out.Tokens = append(out.Tokens, lp.Token)
		out.TokenLogprobs = append(out.TokenLogprobs, lp.Logprob)
		top := map[string]float32{}
		for _, a := range lp.Top {
			top[a.Token] = a.Logprob
		}
		out.TopLogprobs = append(out.TopLogprobs, top)
		out.TextOffset = append(out.TextOffset, offset)
		offset += len(lp.Token)
	}
	return out
}
