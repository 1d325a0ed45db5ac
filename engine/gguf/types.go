package gguf

import (
	"fmt"
	"math/bits"
)

// TensorType is a ggml tensor element type (enum ggml_type).
type TensorType uint32

// The ggml tensor types this package knows the block layout of. The numbers
// are ggml's and are what GGUF files store.
const (
	TypeF32     TensorType = 0
	TypeF16     TensorType = 1
	TypeQ4_0    TensorType = 2
	TypeQ4_1    TensorType = 3
	TypeQ5_0    TensorType = 6
	TypeQ5_1    TensorType = 7
	TypeQ8_0    TensorType = 8
	TypeQ8_1    TensorType = 9
	TypeQ2_K    TensorType = 10
	TypeQ3_K    TensorType = 11
	TypeQ4_K    TensorType = 12
	TypeQ5_K    TensorType = 13
	TypeQ6_K    TensorType = 14
	TypeQ8_K    TensorType = 15
	TypeIQ2_XXS TensorType = 16
	TypeIQ2_XS  TensorType = 17
	TypeIQ3_XXS TensorType = 18
	TypeIQ1_S   TensorType = 19
	TypeIQ4_NL  TensorType = 20
	TypeIQ3_S   TensorType = 21
	TypeIQ2_S   TensorType = 22
	TypeIQ4_XS  TensorType = 23
	TypeI8      TensorType = 24
	TypeI16     TensorType = 25
	TypeI32     TensorType = 26
	TypeI64     TensorType = 27
	TypeF64     TensorType = 28
	TypeIQ1_M   TensorType = 29
	TypeBF16    TensorType = 30
	TypeTQ1_0   TensorType = 34
	TypeTQ2_0   TensorType = 35
	TypeMXFP4   TensorType = 39
)

type typeTraits struct {
	name      string
	blockSize uint64 // elements per block
	typeSize  uint64 // bytes per block
}

// Block sizes and byte sizes from ggml (ggml.c type_traits, ggml-common.h
// static_asserts) at the pinned llama.cpp.
var tensorTypes = map[TensorType]typeTraits{
	TypeF32:     {"F32", 1, 4},
	TypeF16:     {"F16", 1, 2},
	TypeQ4_0:    {"Q4_0", 32, 18},
	TypeQ4_1:    {"Q4_1", 32, 20},
	TypeQ5_0:    {"Q5_0", 32, 22},
	TypeQ5_1:    {"Q5_1", 32, 24},
	TypeQ8_0:    {"Q8_0", 32, 34},
	TypeQ8_1:    {"Q8_1", 32, 36},
	TypeQ2_K:    {"Q2_K", 256, 84},
	TypeQ3_K:    {"Q3_K", 256, 110},
	TypeQ4_K:    {"Q4_K", 256, 144},
	TypeQ5_K:    {"Q5_K", 256, 176},
	TypeQ6_K:    {"Q6_K", 256, 210},
	TypeQ8_K:    {"Q8_K", 256, 292},
	TypeIQ2_XXS: {"IQ2_XXS", 256, 66},
	TypeIQ2_XS:  {"IQ2_XS", 256, 74},
	TypeIQ3_XXS: {"IQ3_XXS", 256, 98},
	TypeIQ1_S:   {"IQ1_S", 256, 50},
	TypeIQ4_NL:  {"IQ4_NL", 32, 18},
	TypeIQ3_S:   {"IQ3_S", 256, 110},
	TypeIQ2_S:   {"IQ2_S", 256, 82},
	TypeIQ4_XS:  {"IQ4_XS", 256, 136},
	TypeI8:      {"I8", 1, 1},
	TypeI16:     {"I16", 1, 2},
	TypeI32:     {"I32", 1, 4},
	TypeI64:     {"I64", 1, 8},
	TypeF64:     {"F64", 1, 8},
	TypeIQ1_M:   {"IQ1_M", 256, 56},
	TypeBF16:    {"BF16", 1, 2},
	TypeTQ1_0:   {"TQ1_0", 256, 54},
	TypeTQ2_0:   {"TQ2_0", 256, 66},
	TypeMXFP4:   {"MXFP4", 32, 17},
}

// Known reports whether the package knows the layout of t.
func (t TensorType) Known() bool { _, ok := tensorTypes[t]; return ok }

// BlockSize is the number of elements per block (1 for plain types), or 0
// for an unknown type.
func (t TensorType) BlockSize() uint64 { return tensorTypes[t].blockSize }

// TypeSize is the number of bytes per block, or 0 for an unknown type.
func (t TensorType) TypeSize() uint64 { return tensorTypes[t].typeSize }

func (t TensorType) String() string {
	if tt, ok := tensorTypes[t]; ok {
		return tt.name
	}
	return fmt.Sprintf("type(%d)", uint32(t))
}

// maxElements bounds the element count of one tensor (llama.cpp uses
// INT64_MAX; a lower bound keeps every size computation overflow-free).
const maxElements = 1 << 60

// TensorBytes returns the byte size of a tensor of type t and shape (ggml
// order, ne0 first). It fails for unknown types, rows that are not a whole
// number of blocks, and element counts that overflow.
func TensorBytes(t TensorType, shape []uint64) (uint64, error) {
	tt, ok := tensorTypes[t]
	if !ok {
		return 0, fmt.Errorf("%w: %d", ErrUnknownTensorType, uint32(t))
	}
	if len(shape) > MaxDims {
		return 0, fmt.Errorf("%w: %d dimensions > %d", ErrInvalidTensor, len(shape), MaxDims)
	}
	n := uint64(1)
	for _, d := range shape {
		hi, lo := bits.Mul64(n, d)
		if hi != 0 || lo > maxElements {
			return 0, fmt.Errorf("%w: shape %v has too many elements", ErrInvalidTensor, shape)
		}
		n = lo
	}
	ne0 := uint64(1)
	if len(shape) > 0 {
		ne0 = shape[0]
	}
	if ne0%tt.blockSize != 0 {
		return 0, fmt.Errorf("%w: %s row of %d elements is not a multiple of the block size %d", ErrInvalidTensor, tt.name, ne0, tt.blockSize)
	}
	return n / tt.blockSize * tt.typeSize, nil
}

// ParseTensorType maps a ggml type name (case-insensitive, e.g. "f16",
// "Q4_K") to its TensorType.
func ParseTensorType(s string) (TensorType, error) {
	for t, tt := range tensorTypes {
		if equalFold(tt.name, s) {
			return t, nil
		}
	}
	return 0, fmt.Errorf("%w: %q", ErrUnknownTensorType, s)
}

func equalFold(a, b string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := 0; i < len(a); i++ {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// ValueType is a GGUF metadata value type (enum gguf_type).
type ValueType uint32

// GGUF metadata value types.
const (
	ValUint8   ValueType = 0
	ValInt8    ValueType = 1
	ValUint16  ValueType = 2
	ValInt16   ValueType = 3
	ValUint32  ValueType = 4
	ValInt32   ValueType = 5
	ValFloat32 ValueType = 6
	ValBool    ValueType = 7
	ValString  ValueType = 8
	ValArray   ValueType = 9
	ValUint64  ValueType = 10
	ValInt64   ValueType = 11
	ValFloat64 ValueType = 12
)

var valueTypeNames = [...]string{"uint8", "int8", "uint16", "int16", "uint32", "int32", "float32", "bool", "string", "array", "uint64", "int64", "float64"}

func (t ValueType) String() string {
	if int(t) < len(valueTypeNames) {
		return valueTypeNames[t]
	}
	return fmt.Sprintf("gguf_type(%d)", uint32(t))
}

// fixedSize is the encoded size of a scalar of type t, 0 for string/array
// (variable) and -1 for unknown types.
func (t ValueType) fixedSize() int {
	switch t {
	case ValUint8, ValInt8, ValBool:
		return 1
	case ValUint16, ValInt16:
		return 2
	case ValUint32, ValInt32, ValFloat32:
		return 4
	case ValUint64, ValInt64, ValFloat64:
		return 8
	case ValString, ValArray:
		return 0
	}
	return -1
}
