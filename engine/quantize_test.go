package engine

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/neuron-tai/meshp2p/engine/gguf"
)

// gguf.CheckQuantizable must agree with llama.cpp's quantizer: whatever it
// accepts quantizes, whatever it refuses would have failed (so callers can
// refuse before any work), and a failed Quantize leaves nothing behind.
func TestCheckQuantizableAgreesWithLlama(t *testing.T) {
	dir := t.TempDir()
	spec := func(arch string, embd, ff int, tied bool) gguf.Spec {
		s := gguf.DefaultSpec(arch)
		s.Layers, s.Heads, s.KVHeads, s.Embd, s.FF, s.Tied, s.Type = 2, 4, 2, embd, ff, tied, gguf.TypeF16
		if arch == "qwen3moe" {
			s.ExpertFF = ff
		}
		return s
	}
	cases := []struct {
		name string
		spec gguf.Spec
		typ  QuantType
	}{
		{"q8_0_ok", spec("llama", 64, 96, false), QuantQ8_0},
		{"q8_0_ff100", spec("llama", 64, 100, false), QuantQ8_0},
		{"q8_0_moe_ff48", spec("qwen3moe", 64, 48, false), QuantQ8_0},
		{"q4_k_m_fallback", spec("llama", 64, 100, false), QuantQ4_KM},
		{"q4_k_m_output40", spec("llama", 40, 64, false), QuantQ4_KM},
		{"q4_k_m_tied40", spec("qwen3", 40, 64, true), QuantQ4_KM},
		{"q4_k_m_moe8_embd48", spec("qwen3moe", 48, 64, false), QuantQ4_KM},
		{"f16_odd", spec("llama", 40, 100, false), QuantF16},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			src := filepath.Join(dir, c.name+".src.gguf")
			if err := gguf.Synth(context.Background(), c.spec, src); err != nil {
				t.Fatal(err)
			}
			f, err := gguf.Open(src)
			if err != nil {
				t.Fatal(err)
			}
			checkErr := gguf.CheckQuantizable(f, string(c.typ))
			f.Close()
			out := filepath.Join(dir, c.name+".gguf")
			qErr := Quantize(context.Background(), src, out, c.typ)
			if (checkErr == nil) != (qErr == nil) {
				t.Fatalf("CheckQuantizable: %v; llama.cpp: %v", checkErr, qErr)
			}
			if qErr != nil {
				if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
					t.Fatalf("failed quantize left %s: %v", out, err)
				}
				return
			}
			m, err := LoadModel(context.Background(), out, LoadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			m.Close()
		})
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if filepath.Ext(e.Name()) != ".gguf" {
			t.Errorf("leftover %s", e.Name())
		}
	}
}
