package gguf

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"
)

// KV is one metadata key/value pair. Value holds exactly one of the Go types
// that map one-to-one to GGUF value types:
//
//	uint8 int8 uint16 int16 uint32 int32 float32 bool string uint64 int64 float64
//
// or a slice of one of them (a GGUF array; nested arrays are not allowed, as
// in llama.cpp).
type KV struct {
	Key   string
	Value any
}

// Metadata is a list of key/value pairs in file order.
type Metadata []KV

// Index returns the position of key, or -1.
func (m Metadata) Index(key string) int {
	for i := range m {
		if m[i].Key == key {
			return i
		}
	}
	return -1
}

// Get returns the value of key.
func (m Metadata) Get(key string) (any, bool) {
	if i := m.Index(key); i >= 0 {
		return m[i].Value, true
	}
	return nil, false
}

// String returns the string value of key; ok is false when the key is absent
// or not a string.
func (m Metadata) String(key string) (string, bool) {
	v, _ := m.Get(key)
	s, ok := v.(string)
	return s, ok
}

// Uint returns a non-negative integer value of any integer type; ok is false
// when the key is absent, not an integer, or negative.
func (m Metadata) Uint(key string) (uint64, bool) {
	v, _ := m.Get(key)
	return asUint(v)
}

// Float returns a float or integer value as float64.
func (m Metadata) Float(key string) (float64, bool) {
	v, _ := m.Get(key)
	switch x := v.(type) {
	case float32:
		return float64(x), true
	case float64:
		return x, true
	}
	if u, ok := asUint(v); ok {
		return float64(u), true
	}
	return 0, false
}

// ArrayLen returns the length of an array value.
func (m Metadata) ArrayLen(key string) (int, bool) {
	v, ok := m.Get(key)
	if !ok {
		return 0, false
	}
	_, elem, n, err := valueInfo(v)
	if err != nil || elem == valueNone {
		return 0, false
	}
	return n, true
}

// Set replaces the value of key in place, or appends the pair.
func (m *Metadata) Set(key string, v any) {
	if i := m.Index(key); i >= 0 {
		(*m)[i].Value = v
		return
	}
	*m = append(*m, KV{key, v})
}

// Delete removes key.
func (m *Metadata) Delete(key string) {
	if i := m.Index(key); i >= 0 {
		*m = append((*m)[:i], (*m)[i+1:]...)
	}
}

// DeletePrefix removes every key that starts with prefix.
func (m *Metadata) DeletePrefix(prefix string) {
	out := (*m)[:0]
	for _, kv := range *m {
		if !strings.HasPrefix(kv.Key, prefix) {
			out = append(out, kv)
		}
	}
	*m = out
}

// Clone returns a copy of the list (values are shared; they are never
// mutated in place by this package).
func (m Metadata) Clone() Metadata { return append(Metadata(nil), m...) }

func asUint(v any) (uint64, bool) {
	switch x := v.(type) {
	case uint8:
		return uint64(x), true
	case uint16:
		return uint64(x), true
	case uint32:
		return uint64(x), true
	case uint64:
		return x, true
	case int8:
		return uint64(x), x >= 0
	case int16:
		return uint64(x), x >= 0
	case int32:
		return uint64(x), x >= 0
	case int64:
		return uint64(x), x >= 0
	}
	return 0, false
}

const valueNone ValueType = math.MaxUint32

// valueInfo returns the GGUF type of v; for arrays elem is the element type
// and n the length, otherwise elem is valueNone.
func valueInfo(v any) (typ, elem ValueType, n int, err error) {
	switch x := v.(type) {
	case uint8:
		return ValUint8, valueNone, 0, nil
	case int8:
		return ValInt8, valueNone, 0, nil
	case uint16:
		return ValUint16, valueNone, 0, nil
	case int16:
		return ValInt16, valueNone, 0, nil
	case uint32:
		return ValUint32, valueNone, 0, nil
	case int32:
		return ValInt32, valueNone, 0, nil
	case float32:
		return ValFloat32, valueNone, 0, nil
	case bool:
		return ValBool, valueNone, 0, nil
	case string:
		return ValString, valueNone, 0, nil
	case uint64:
		return ValUint64, valueNone, 0, nil
	case int64:
		return ValInt64, valueNone, 0, nil
	case float64:
		return ValFloat64, valueNone, 0, nil
	case []uint8:
		return ValArray, ValUint8, len(x), nil
	case []int8:
		return ValArray, ValInt8, len(x), nil
	case []uint16:
		return ValArray, ValUint16, len(x), nil
	case []int16:
		return ValArray, ValInt16, len(x), nil
	case []uint32:
		return ValArray, ValUint32, len(x), nil
	case []int32:
		return ValArray, ValInt32, len(x), nil
	case []float32:
		return ValArray, ValFloat32, len(x), nil
	case []bool:
		return ValArray, ValBool, len(x), nil
	case []string:
		return ValArray, ValString, len(x), nil
	case []uint64:
		return ValArray, ValUint64, len(x), nil
	case []int64:
		return ValArray, ValInt64, len(x), nil
	case []float64:
		return ValArray, ValFloat64, len(x), nil
	}
	return 0, 0, 0, fmt.Errorf("gguf: unsupported metadata value type %T", v)
}

// appendString appends a GGUF string (uint64 length + bytes).
func appendString(b []byte, s string) []byte {
	b = binary.LittleEndian.AppendUint64(b, uint64(len(s)))
	return append(b, s...)
}

// appendKV appends the GGUF encoding of kv (key, type, value).
func appendKV(b []byte, kv KV) ([]byte, error) {
	typ, elem, n, err := valueInfo(kv.Value)
	if err != nil {
		return b, fmt.Errorf("key %q: %w", kv.Key, err)
	}
	b = appendString(b, kv.Key)
	b = binary.LittleEndian.AppendUint32(b, uint32(typ))
	if typ == ValArray {
		b = binary.LittleEndian.AppendUint32(b, uint32(elem))
		b = binary.LittleEndian.AppendUint64(b, uint64(n))
	}
	return appendValue(b, kv.Value), nil
}

func appendValue(b []byte, v any) []byte {
	le := binary.LittleEndian
	switch x := v.(type) {
	case uint8:
		return append(b, x)
	case int8:
		return append(b, byte(x))
	case uint16:
		return le.AppendUint16(b, x)
	case int16:
		return le.AppendUint16(b, uint16(x))
	case uint32:
		return le.AppendUint32(b, x)
	case int32:
		return le.AppendUint32(b, uint32(x))
	case float32:
		return le.AppendUint32(b, math.Float32bits(x))
	case bool:
		if x {
			return append(b, 1)
		}
		return append(b, 0)
	case string:
		return appendString(b, x)
	case uint64:
		return le.AppendUint64(b, x)
	case int64:
		return le.AppendUint64(b, uint64(x))
	case float64:
		return le.AppendUint64(b, math.Float64bits(x))
	case []uint8:
		return append(b, x...)
	case []int8:
		for _, e := range x {
			b = append(b, byte(e))
		}
	case []uint16:
		for _, e := range x {
			b = le.AppendUint16(b, e)
		}
	case []int16:
		for _, e := range x {
			b = le.AppendUint16(b, uint16(e))
		}
	case []uint32:
		for _, e := range x {
			b = le.AppendUint32(b, e)
		}
	case []int32:
		for _, e := range x {
			b = le.AppendUint32(b, uint32(e))
		}
	case []float32:
		for _, e := range x {
			b = le.AppendUint32(b, math.Float32bits(e))
		}
	case []bool:
		for _, e := range x {
			b = appendValue(b, e)
		}
	case []string:
		for _, e := range x {
			b = appendString(b, e)
		}
	case []uint64:
		for _, e := range x {
			b = le.AppendUint64(b, e)
		}
	case []int64:
		for _, e := range x {
			b = le.AppendUint64(b, uint64(e))
		}
	case []float64:
		for _, e := range x {
			b = le.AppendUint64(b, math.Float64bits(e))
		}
	}
	return b
}
