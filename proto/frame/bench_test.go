package frame

import (
	"bytes"
	"fmt"
	"io"
	"testing"
)

var benchShapes = []struct{ rows, width int }{{1, 4096}, {512, 4096}}

func BenchmarkWriteActivation(b *testing.B) {
	for _, s := range benchShapes {
		b.Run(fmt.Sprintf("f32_%dx%d", s.rows, s.width), func(b *testing.B) {
			hdr, tensors := testBundle(s.rows, s.width, false)
			w := NewWriter(io.Discard, Limits{})
			b.SetBytes(int64(len(tensors[0])))
			b.ReportAllocs()
			for b.Loop() {
				if err := w.WriteActivation(hdr, tensors...); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkReadActivation(b *testing.B) {
	for _, s := range benchShapes {
		b.Run(fmt.Sprintf("f32_%dx%d", s.rows, s.width), func(b *testing.B) {
			hdr, tensors := testBundle(s.rows, s.width, false)
			wire := encodeActivation(b, hdr, tensors...)
			src := bytes.NewReader(wire)
			r := NewReader(src, Limits{})
			b.SetBytes(int64(len(tensors[0])))
			b.ReportAllocs()
			for b.Loop() {
				src.Reset(wire)
				if _, _, err := r.ReadActivation(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkF16(b *testing.B) {
	const n = 512 * 4096
	src := make([]float32, n)
	for i := range src {
		src[i] = float32(i%2000) * 0.37
	}
	enc, err := EncodeF16(nil, src)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("encode_512x4096", func(b *testing.B) {
		dst := make([]byte, 0, 2*n)
		b.SetBytes(4 * n)
		for b.Loop() {
			if _, err := EncodeF16(dst[:0], src); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode_512x4096", func(b *testing.B) {
		dst := make([]float32, 0, n)
		b.SetBytes(4 * n)
		for b.Loop() {
			if _, err := DecodeF16(dst[:0], enc); err != nil {
				b.Fatal(err)
			}
		}
	})
}
