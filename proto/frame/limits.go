package frame

import "math"

// Default limits. MaxPayload fits a 2048-row f32 chunk of an 8192-wide model
// (64 MiB) with room to spare.
const (
	DefaultMaxHeader  = 64 << 10  // 64 KiB
	DefaultMaxPayload = 256 << 20 // 256 MiB
	DefaultMaxTensors = 16
	DefaultMaxRank    = 4
	DefaultMaxRows    = 16384
	DefaultMaxNameLen = 64

	// PrefixSize is the size of the fixed frame prefix.
	PrefixSize = 8
	// SessionIDLen is the length of a session id in bytes.
	SessionIDLen = 16
)

// Limits bound what a Reader accepts and what a Writer sends. A zero field
// takes its default; values above what the prefix can express are clamped.
type Limits struct {
	MaxHeader  int // bytes of protobuf header
	MaxPayload int // bytes of payload (sum of tensor byte lengths)
	MaxTensors int // tensors per activation bundle
	MaxRank    int // dimensions per tensor
	MaxRows    int // ActivationHeader.n_rows
	MaxNameLen int // bytes of a tensor name
}

// DefaultLimits returns the default limits.
func DefaultLimits() Limits { return Limits{}.norm() }

func (l Limits) norm() Limits {
	def := func(v, d int) int {
		if v <= 0 {
			return d
		}
		return v
	}
	l.MaxHeader = min(def(l.MaxHeader, DefaultMaxHeader), math.MaxUint32)
	l.MaxPayload = min(def(l.MaxPayload, DefaultMaxPayload), math.MaxUint32)
	l.MaxTensors = def(l.MaxTensors, DefaultMaxTensors)
	l.MaxRank = def(l.MaxRank, DefaultMaxRank)
	l.MaxRows = min(def(l.MaxRows, DefaultMaxRows), math.MaxInt32)
	l.MaxNameLen = def(l.MaxNameLen, DefaultMaxNameLen)
	return l
}
