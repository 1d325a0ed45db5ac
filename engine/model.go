package engine

/*
#include <stdlib.h>
#include "mp.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime/cgo"
	"strconv"
	"unsafe"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// Errors callers branch on.
var (
	ErrNoVocab        = errors.New("engine: model has no vocabulary (middle shard); tokenizer calls are not allowed")
	ErrNoChatTemplate = errors.New("engine: model has no chat template")
	ErrLoad           = errors.New("engine: llama.cpp could not load the model")
)

// Metadata keys written by engine/gguf into shard files.
const (
	keyParentFingerprint = "meshp2p.parent.fingerprint"
	keyParentNLayer      = "meshp2p.parent.n_layer"
	keyRangeStart        = "meshp2p.range.start"
	keyRangeEnd          = "meshp2p.range.end"
)

// ModelInfo describes a loaded model or shard.
type ModelInfo struct {
	Path      string
	Arch      string
	NLayer    int // layers held by this file
	NEmbd     int
	NVocab    int // 1 on middle shards (stand-in vocabulary)
	NCtxTrain int
	NParams   uint64
	HasVocab  bool
	// Range is the global layer range [Start, End) of the parent model this
	// file holds; a whole model has Start 0 and End == ParentNLayer.
	Start, End   int
	ParentNLayer int
	// ParentFingerprint is the fingerprint recorded in a shard file ("" for
	// a whole model: compute it with engine/gguf).
	ParentFingerprint string
	VocabOnly         bool
}

// IsHead reports whether the shard takes token ids (holds layer 0).
func (i ModelInfo) IsHead() bool { return i.Start == 0 }

// IsTail reports whether the shard produces logits (holds the last layer).
func (i ModelInfo) IsTail() bool { return i.End == i.ParentNLayer }

// Model is a loaded GGUF model, shard or vocabulary. It is safe for
// concurrent use by tokenizer calls; compute goes through a Shard.
type Model struct {
	ptr    *C.struct_llama_model
	vocab  *C.struct_llama_vocab
	info   ModelInfo
	device Device
}

// LoadOptions control model loading.
type LoadOptions struct {
	// VocabOnly loads only the tokenizer (for thin clients without weights).
	VocabOnly bool
	// Validate runs before llama.cpp sees the file, after the engine's own
	// pure-Go checks (validateFile), for callers' extra checks (e.g. that a
	// shard belongs to the expected model: gguf.CheckShard).
	Validate func(ctx context.Context, path string) error
	// NoMmap reads the weights into the process's own memory instead of
	// mapping the file. Mapped pages are page cache: under a container
	// memory limit they are not (all) charged to the container, so a
	// model can seem to fit where it does not. Results are identical.
	NoMmap bool
	// Device runs the layers (SelectDevice; the zero Device: the CPU).
	// On a GPU every layer of the file and the output head go there;
	// the token embeddings stay on the CPU, as llama.cpp keeps them.
	Device Device
	// Progress, if set, is called as llama.cpp loads the weights with the
	// fraction done (0 to 1). Whether or not it is set, a load whose ctx
	// ends is aborted at the next report (ctx.Err() is returned).
	Progress func(done float32)
	// measureRefused loads an architecture gguf refuses with a measured
	// reason (gguf.ErrRefusedArch: qwen3next), for the engine's own tests
	// that measure it; nothing outside the package can set it.
	measureRefused bool
}

// checkLoad is LoadModel's checks before llama.cpp sees path; vocabFP is
// validateFile's.
func checkLoad(ctx context.Context, path string, opts LoadOptions) (vocabFP string, err error) {
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("engine: load %s: %w", path, err)
	}
	if vocabFP, err = validateFile(path, opts.VocabOnly, opts.measureRefused); err != nil {
		return "", fmt.Errorf("engine: load %s: %w", path, err)
	}
	if opts.Validate != nil {
		if err := opts.Validate(ctx, path); err != nil {
			return "", fmt.Errorf("engine: load %s: %w", path, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return "", err
	}
	if !opts.Device.IsCPU() && opts.Device.dev == nil {
		return "", fmt.Errorf("%w: device %q was not found by SelectDevice", ErrNoDevice, opts.Device.Name)
	}
	return vocabFP, nil
}

// validateFile checks path in pure Go before llama.cpp sees it, because
// llama.cpp's loader aborts the process (GGML_ASSERT) on some bad input:
// the GGUF header must parse (corrupt, truncated and hostile files fail
// here), and the file must pass gguf.ValidateForLoad (known architecture,
// sane hyper-parameters such as expert_used_count, required tensors) and
// gguf.ValidateTokenizer. A vocabulary-only load reads no hyper-parameters
// and no tensors, so it gets the lighter gguf.ValidateVocabForLoad. It
// returns the vocabulary fingerprint a vocabulary file claims ("" if none).
func validateFile(path string, vocabOnly, measureRefused bool) (string, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	if vocabOnly {
		if err := gguf.ValidateVocabForLoad(f); err != nil {
			return "", err
		}
		fp, _ := gguf.ReadVocabFingerprint(f.Metadata)
		return fp, nil
	}
	if err := gguf.ValidateForLoad(f); err != nil && !(measureRefused && errors.Is(err, gguf.ErrRefusedArch)) {
		return "", err
	}
	if err := gguf.ValidateTokenizer(f.Metadata); err != nil {
		return "", err
	}
	return "", nil
}

// warmShare is the part of a load's progress the warm pass reports when it
// reads the file (llama.cpp's own pass over cached pages is the rest).
const warmShare = 0.9

// warm brings the weights a CPU load maps into the page cache in 2 MiB
// folios (gguf.WarmPages: the engine's mapping then walks far fewer page
// table entries a token) and returns how llama.cpp's progress is to be
// scaled after it.
func warm(ctx context.Context, path string, opts LoadOptions) (func(float32) float32, error) {
	same := func(d float32) float32 { return d }
	if opts.NoMmap || opts.VocabOnly || !opts.Device.IsCPU() {
		return same, nil
	}
	var report func(float64)
	if opts.Progress != nil {
		report = func(d float64) { opts.Progress(float32(d * warmShare)) }
	}
	read, err := gguf.WarmPages(ctx, path, report)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return nil, fmt.Errorf("engine: load %s: %w", path, cerr)
		}
		return same, nil // advice: llama.cpp reads the file as it always did
	}
	if read == 0 {
		return same, nil
	}
	return func(d float32) float32 { return warmShare + (1-warmShare)*d }, nil
}

// LoadModel loads a whole model, a shard file or (VocabOnly) a vocabulary
// (a model, a head/tail shard or a gguf.WriteVocab file). The file is
// validated in pure Go first (validateFile, then opts.Validate), so bad
// files give an error wrapping the gguf error (gguf.ErrNotLoadable,
// *gguf.FormatError, ...) instead of a llama.cpp abort.
func LoadModel(ctx context.Context, path string, opts LoadOptions) (*Model, error) {
	vocabFP, err := checkLoad(ctx, path, opts)
	if err != nil {
		return nil, err
	}
	scale, err := warm(ctx, path, opts)
	if err != nil {
		return nil, err
	}
	initBackend()
	p := C.llama_model_default_params()
	h := cgo.NewHandle(func(done float32) bool {
		if opts.Progress != nil {
			opts.Progress(scale(done))
		}
		return ctx.Err() == nil
	})
	defer h.Delete()
	p.vocab_only = C.bool(opts.VocabOnly)
	p.use_mmap = C.bool(!opts.NoMmap)
	// An explicit device list: with a GPU backend loaded, llama.cpp would
	// otherwise spread the layers over every GPU it finds.
	devs := (*[2]C.ggml_backend_dev_t)(C.calloc(2, C.size_t(unsafe.Sizeof(C.ggml_backend_dev_t(nil)))))
	defer C.free(unsafe.Pointer(devs))
	p.devices = &devs[0]
	p.n_gpu_layers = 0
	if !opts.Device.IsCPU() && !opts.VocabOnly {
		devs[0] = opts.Device.dev
		p.n_gpu_layers = 999
		p.split_mode = C.LLAMA_SPLIT_MODE_NONE
		p.main_gpu = 0
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	ptr := C.mp_model_load(cpath, p, C.uintptr_t(h)) // the progress callback is set there (mp.c)
	if ptr == nil {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("engine: load %s: %w", path, err)
		}
		return nil, fmt.Errorf("%w: %s (see the log above for llama.cpp's reason)", ErrLoad, path)
	}
	m := &Model{ptr: ptr, vocab: C.llama_model_get_vocab(ptr), device: opts.Device}
	if opts.VocabOnly {
		m.device = Device{}
	}
	m.info = ModelInfo{
		Path:      path,
		NLayer:    int(C.llama_model_n_layer(ptr)),
		NEmbd:     int(C.llama_model_n_embd(ptr)),
		NVocab:    int(C.llama_vocab_n_tokens(m.vocab)),
		NCtxTrain: int(C.llama_model_n_ctx_train(ptr)),
		NParams:   uint64(C.llama_model_n_params(ptr)),
		VocabOnly: opts.VocabOnly,
	}
	m.info.Arch = m.meta("general.architecture")
	m.info.HasVocab = C.llama_vocab_type(m.vocab) != C.LLAMA_VOCAB_TYPE_NONE
	m.info.ParentFingerprint = m.meta(keyParentFingerprint)
	m.info.Start, m.info.End, m.info.ParentNLayer = 0, m.info.NLayer, m.info.NLayer
	if vocabFP != "" {
		// A vocabulary file (gguf.WriteVocab): no layers, no range.
		m.info.ParentFingerprint = vocabFP
		m.info.ParentNLayer = m.metaInt(keyParentNLayer)
		m.info.End = m.info.ParentNLayer
		return m, nil
	}
	if m.info.ParentFingerprint != "" {
		s, e, n := m.metaInt(keyRangeStart), m.metaInt(keyRangeEnd), m.metaInt(keyParentNLayer)
		if s < 0 || e <= s || n < e || (!opts.VocabOnly && e-s != m.info.NLayer) {
			m.Close()
			return nil, fmt.Errorf("engine: load %s: inconsistent shard metadata: range [%d,%d) of %d layers, file holds %d", path, s, e, n, m.info.NLayer)
		}
		m.info.Start, m.info.End, m.info.ParentNLayer = s, e, n
	}
	return m, nil
}

func (m *Model) meta(key string) string {
	ck := C.CString(key)
	defer C.free(unsafe.Pointer(ck))
	var buf [256]C.char
	n := C.llama_model_meta_val_str(m.ptr, ck, &buf[0], C.size_t(len(buf)))
	if n < 0 {
		return ""
	}
	return C.GoString(&buf[0])
}

func (m *Model) metaInt(key string) int {
	v, err := strconv.Atoi(m.meta(key))
	if err != nil {
		return -1
	}
	return v
}

// Device is the device the model's layers run on (the zero Device: the
// CPU).
func (m *Model) Device() Device { return m.device }

// Info returns the model's description.
func (m *Model) Info() ModelInfo { return m.info }

// Close frees the model. Shards using it must be closed first.
func (m *Model) Close() {
	if m.ptr != nil {
		C.llama_model_free(m.ptr)
		m.ptr = nil
	}
}

// BOS, EOS return special token ids (-1 when the model has none).
func (m *Model) BOS() int32 { return int32(C.llama_vocab_bos(m.vocab)) }
func (m *Model) EOS() int32 { return int32(C.llama_vocab_eos(m.vocab)) }

// IsEOG reports whether tok ends generation (EOS, EOT, ...).
func (m *Model) IsEOG(tok int32) bool {
	if !m.info.HasVocab || tok < 0 || int(tok) >= m.info.NVocab {
		return false
	}
	return bool(C.llama_vocab_is_eog(m.vocab, C.llama_token(tok)))
}

// Tokenize converts text to token ids. addSpecial adds BOS/EOS as the model
// asks; parseSpecial lets control tokens in text through.
func (m *Model) Tokenize(text string, addSpecial, parseSpecial bool) ([]int32, error) {
	if !m.info.HasVocab {
		return nil, ErrNoVocab
	}
	ct := C.CString(text)
	defer C.free(unsafe.Pointer(ct))
	n := len(text) + 8
	for range 2 {
		buf := make([]C.llama_token, n)
		got := C.llama_tokenize(m.vocab, ct, C.int32_t(len(text)), &buf[0], C.int32_t(n), C.bool(addSpecial), C.bool(parseSpecial))
		if got >= 0 {
			out := make([]int32, got)
			for i := range out {
				out[i] = int32(buf[i])
			}
			return out, nil
		}
		n = int(-got)
	}
	return nil, fmt.Errorf("engine: tokenize: buffer size mismatch")
}

// TokenPiece returns the text of one token (special tokens rendered only
// when special is true).
func (m *Model) TokenPiece(tok int32, special bool) (string, error) {
	if !m.info.HasVocab {
		return "", ErrNoVocab
	}
	if tok < 0 || int(tok) >= m.info.NVocab {
		return "", fmt.Errorf("engine: token %d outside vocabulary of %d", tok, m.info.NVocab)
	}
	buf := make([]C.char, 64)
	for range 2 {
		n := C.llama_token_to_piece(m.vocab, C.llama_token(tok), &buf[0], C.int32_t(len(buf)), 0, C.bool(special))
		if n >= 0 {
			return C.GoStringN(&buf[0], n), nil
		}
		buf = make([]C.char, int(-n)+1)
	}
	return "", fmt.Errorf("engine: token_to_piece: buffer size mismatch")
}

// Detokenize turns tokens back into text (no special tokens).
func (m *Model) Detokenize(toks []int32) (string, error) {
	var b []byte
	for _, t := range toks {
		p, err := m.TokenPiece(t, false)
		if err != nil {
			return "", err
		}
		b = append(b, p...)
	}
	return string(b), nil
}

// ChatMessage is one turn of a conversation.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatTemplate is the model's chat template source (Jinja, as the GGUF's
// tokenizer.chat_template holds it; "" when it has none).
func (m *Model) ChatTemplate() string {
	tmpl := C.llama_model_chat_template(m.ptr, nil)
	if tmpl == nil {
		return ""
	}
	return C.GoString(tmpl)
}

// ApplyChatTemplate renders messages with the model's own chat template
// (llama_chat_apply_template), adding the assistant prefix when addAssistant.
func (m *Model) ApplyChatTemplate(msgs []ChatMessage, addAssistant bool) (string, error) {
	tmpl := C.llama_model_chat_template(m.ptr, nil)
	if tmpl == nil {
		return "", ErrNoChatTemplate
	}
	if len(msgs) == 0 {
		return "", errors.New("engine: chat template: no messages")
	}
	cmsgs := (*[1 << 20]C.struct_llama_chat_message)(C.malloc(C.size_t(len(msgs)) * C.size_t(unsafe.Sizeof(C.struct_llama_chat_message{}))))[:len(msgs):len(msgs)]
	defer C.free(unsafe.Pointer(&cmsgs[0]))
	var frees []unsafe.Pointer
	defer func() {
		for _, p := range frees {
			C.free(p)
		}
	}()
	total := 0
	for i, msg := range msgs {
		r, c := C.CString(msg.Role), C.CString(msg.Content)
		frees = append(frees, unsafe.Pointer(r), unsafe.Pointer(c))
		cmsgs[i].role, cmsgs[i].content = r, c
		total += len(msg.Role) + len(msg.Content)
	}
	n := 2*total + 256
	for range 2 {
		buf := make([]C.char, n)
		got := C.llama_chat_apply_template(tmpl, &cmsgs[0], C.size_t(len(msgs)), C.bool(addAssistant), &buf[0], C.int32_t(n))
		if got < 0 {
			return "", fmt.Errorf("engine: chat template not supported by llama.cpp (%d)", int(got))
		}
		if int(got) <= n {
			return C.GoStringN(&buf[0], got), nil
		}
		n = int(got) + 1
	}
	return "", errors.New("engine: chat template: buffer size mismatch")
}
