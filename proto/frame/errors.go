package frame

import (
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"google.golang.org/protobuf/proto"
)

// Sentinel errors; the errors returned by this package wrap them (test with
// errors.Is).
var (
	// ErrFrameTooLarge: a header, payload, tensor count, rank, row count or
	// name is over the Limits.
	ErrFrameTooLarge = errors.New("frame: too large")
	// ErrMalformed: the frame violates the framing or bundle rules, is
	// truncated, or its header does not parse.
	ErrMalformed = errors.New("frame: malformed")
	// ErrChecksum: a tensor's bytes do not match its CRC-32C.
	ErrChecksum = errors.New("frame: checksum mismatch")
	// ErrUnsupportedDType: a tensor has a dtype this version does not know.
	ErrUnsupportedDType = errors.New("frame: unsupported dtype")
	// ErrUnexpectedMessage: a well-formed frame of a kind the caller did not
	// ask for (see UnexpectedMessageError).
	ErrUnexpectedMessage = errors.New("frame: unexpected message")
	// ErrNonFinite: f16 encoding produced ±Inf or NaN (input non-finite or
	// |x| above 65504); callers fall back to f32.
	ErrNonFinite = errors.New("frame: value not finite in f16")
)

// UnexpectedMessageError is returned by ReadActivation when the frame holds
// another kind of StreamMessage. The frame was consumed completely, so the
// stream stays usable and the caller can handle Msg.
type UnexpectedMessageError struct {
	Msg *meshp2pb.StreamMessage
}

func (e *UnexpectedMessageError) Error() string {
	return fmt.Sprintf("frame: unexpected message %s", kindName(e.Msg))
}

// Is makes errors.Is(err, ErrUnexpectedMessage) true.
func (e *UnexpectedMessageError) Is(target error) bool { return target == ErrUnexpectedMessage }

func kindName(m *meshp2pb.StreamMessage) string {
	if m == nil {
		return "<nil>"
	}
	if f := m.ProtoReflect().WhichOneof(m.ProtoReflect().Descriptor().Oneofs().ByName("kind")); f != nil {
		return string(f.Name())
	}
	return "<unknown kind>"
}

// RemoteError is an Error message received from a peer, as a Go error.
type RemoteError struct {
	E *meshp2pb.Error
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("remote error %s: %s", e.E.GetCode(), e.E.GetMessage())
}

// FromProto turns a received Error into a Go error (nil for nil).
func FromProto(pe *meshp2pb.Error) error {
	if pe == nil {
		return nil
	}
	return &RemoteError{E: pe}
}

// Code maps an error to the wire error code: this package's sentinels,
// RemoteError (its own code), context cancellation and deadlines. nil maps to
// UNSPECIFIED, anything else to INTERNAL.
func Code(err error) meshp2pb.ErrorCode {
	var re *RemoteError
	switch {
	case err == nil:
		return meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED
	case errors.As(err, &re):
		return re.E.GetCode()
	case errors.Is(err, ErrFrameTooLarge):
		return meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE
	case errors.Is(err, ErrChecksum):
		return meshp2pb.ErrorCode_ERROR_CODE_CHECKSUM_MISMATCH
	case errors.Is(err, ErrUnsupportedDType):
		return meshp2pb.ErrorCode_ERROR_CODE_UNSUPPORTED_DTYPE
	case errors.Is(err, ErrMalformed):
		return meshp2pb.ErrorCode_ERROR_CODE_MALFORMED
	case errors.Is(err, ErrUnexpectedMessage):
		return meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE
	case errors.Is(err, context.Canceled):
		return meshp2pb.ErrorCode_ERROR_CODE_CANCELLED
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return meshp2pb.ErrorCode_ERROR_CODE_TIMEOUT
	default:
		return meshp2pb.ErrorCode_ERROR_CODE_INTERNAL
	}
}

// Retryable reports whether the same request may succeed on another route
// or later. Codes this version does not know are not retryable.
func Retryable(c meshp2pb.ErrorCode) bool {
	switch c {
	case meshp2pb.ErrorCode_ERROR_CODE_CHECKSUM_MISMATCH,
		meshp2pb.ErrorCode_ERROR_CODE_MODEL_MISMATCH,
		meshp2pb.ErrorCode_ERROR_CODE_RANGE_MISMATCH,
		meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY,
		meshp2pb.ErrorCode_ERROR_CODE_SESSION_UNKNOWN,
		meshp2pb.ErrorCode_ERROR_CODE_INTERNAL,
		meshp2pb.ErrorCode_ERROR_CODE_TIMEOUT,
		meshp2pb.ErrorCode_ERROR_CODE_TICKET_EXPIRED,
		meshp2pb.ErrorCode_ERROR_CODE_UNSUPPORTED_DTYPE,
		meshp2pb.ErrorCode_ERROR_CODE_SHUTTING_DOWN,
		meshp2pb.ErrorCode_ERROR_CODE_NEXT_HOP_UNREACHABLE:
		return true
	}
	return false
}

// ToProto builds the Error message to send for err (nil for nil). A
// RemoteError is passed on unchanged (cloned); other errors get Code(err),
// err.Error(). Callers fill peer and session fields.
func ToProto(err error) *meshp2pb.Error {
	if err == nil {
		return nil
	}
	var re *RemoteError
	if errors.As(err, &re) && re.E != nil {
		return proto.Clone(re.E).(*meshp2pb.Error)
	}
	c := Code(err)
	return &meshp2pb.Error{Code: c, Message: err.Error()}
}
