package route

import "testing"

func TestRouteBatchInvariant(t *testing.T) {
	cpu := "cpu/amd64/avx2/llama.cpp@ec98e2002/fa"
	vk := "vulkan/llvmpipe (LLVM 15.0.6, 256 bits)/llama.cpp@ec98e2002/fa"
	for _, tc := range []struct {
		name    string
		classes []string
		want    bool
	}{
		{"all cpu", []string{cpu, cpu, cpu}, true},
		{"unknown (ticket, older node)", []string{"", cpu}, true},
		{"one vulkan hop", []string{cpu, vk, cpu}, false},
		{"all vulkan", []string{vk, vk}, false},
		{"cuda", []string{"cuda/NVIDIA H200/llama.cpp@ec98e2002/fa"}, false},
		{"no hops", nil, true},
		{"a test engine's class", []string{"fake"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Route{}
			for _, c := range tc.classes {
				r.Hops = append(r.Hops, Hop{KernelClass: c})
			}
			if got := r.BatchInvariant(); got != tc.want {
				t.Fatalf("BatchInvariant = %v, want %v", got, tc.want)
			}
		})
	}
}
