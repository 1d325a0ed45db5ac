package frame

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"testing"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"google.golang.org/protobuf/proto"
)

var testSID = []byte("0123456789abcdef")

// testBundle returns a header and tensors: rows x width f32 "l_out" plus,
// when f16, an extra odd-sized f16 tensor before it (so alignment matters).
func testBundle(rows, width int, f16 bool) (*meshp2pb.ActivationHeader, [][]byte) {
	hdr := &meshp2pb.ActivationHeader{
		SessionId: testSID, Epoch: 3, Step: 7, PosStart: 10, NRows: uint32(rows),
		IsPrefill: rows > 1, LastChunk: true,
	}
	var tensors [][]byte
	if f16 {
		vals := make([]float32, rows*3)
		for i := range vals {
			vals[i] = float32(i) / 4
		}
		b, err := EncodeF16(nil, vals)
		if err != nil {
			panic(err)
		}
		hdr.Tensors = append(hdr.Tensors, &meshp2pb.TensorInfo{Name: "residual", Dtype: meshp2pb.DType_DTYPE_F16, Shape: []int64{int64(rows), 3}})
		tensors = append(tensors, b)
	}
	f := make([]float32, rows*width)
	for i := range f {
		f[i] = float32(i)*0.5 - 3
	}
	hdr.Tensors = append(hdr.Tensors, &meshp2pb.TensorInfo{Name: "l_out", Shape: []int64{int64(rows), int64(width)}})
	tensors = append(tensors, F32Bytes(f))
	return hdr, tensors
}

func encodeActivation(t testing.TB, hdr *meshp2pb.ActivationHeader, tensors ...[]byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteActivation(&buf, hdr, tensors...); err != nil {
		t.Fatalf("WriteActivation: %v", err)
	}
	return buf.Bytes()
}

// rawFrame builds a frame from a header message and payload, with optional
// overrides of the declared lengths (-1: use the real ones).
func rawFrame(hdr proto.Message, payload []byte, declHdr, declPay int64) []byte {
	hb, err := proto.Marshal(hdr)
	if err != nil {
		panic(err)
	}
	if declHdr < 0 {
		declHdr = int64(len(hb))
	}
	if declPay < 0 {
		declPay = int64(len(payload))
	}
	out := binary.BigEndian.AppendUint32(nil, uint32(declHdr))
	out = binary.BigEndian.AppendUint32(out, uint32(declPay))
	out = append(out, hb...)
	return append(out, payload...)
}

func actMsg(hdr *meshp2pb.ActivationHeader) *meshp2pb.StreamMessage {
	return &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Activation{Activation: hdr}}
}

func TestActivationRoundTrip(t *testing.T) {
	cases := []struct {
		name        string
		rows, width int
		f16         bool
	}{
		{"decode 1x4096", 1, 4096, false},
		{"prefill 7x64", 7, 64, false},
		{"f16 then f32, odd sizes", 3, 5, true},
		{"zero width", 2, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hdr, tensors := testBundle(tc.rows, tc.width, tc.f16)
			wire := encodeActivation(t, hdr, tensors...)
			got, gotT, err := ReadActivation(bytes.NewReader(wire), Limits{})
			if err != nil {
				t.Fatalf("ReadActivation: %v", err)
			}
			if !proto.Equal(got, hdr) {
				t.Fatalf("header mismatch:\n got %v\nwant %v", got, hdr)
			}
			if len(gotT) != len(tensors) {
				t.Fatalf("got %d tensors, want %d", len(gotT), len(tensors))
			}
			for i := range tensors {
				if !bytes.Equal(gotT[i], tensors[i]) {
					t.Errorf("tensor %d differs", i)
				}
				if len(gotT[i]) > 0 && !aligned4(gotT[i]) {
					t.Errorf("tensor %d not aligned", i)
				}
				if hdr.Tensors[i].Crc32C != Checksum(tensors[i]) {
					t.Errorf("tensor %d: writer did not set crc32c", i)
				}
			}
			// The last tensor is f32 l_out: view it and compare values.
			f, err := AsF32(gotT[len(gotT)-1])
			if err != nil {
				t.Fatal(err)
			}
			for i, v := range f {
				if want := float32(i)*0.5 - 3; v != want {
					t.Fatalf("l_out[%d] = %v, want %v", i, v, want)
				}
			}
		})
	}
}

func TestTokensOnlyBundle(t *testing.T) {
	hdr := &meshp2pb.ActivationHeader{SessionId: testSID, NRows: 3, Tokens: []int32{1, 2, 3}, IsPrefill: true}
	wire := encodeActivation(t, hdr)
	got, tensors, err := ReadActivation(bytes.NewReader(wire), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tensors) != 0 || !proto.Equal(got, hdr) {
		t.Fatalf("got %v %d tensors", got, len(tensors))
	}
}

// A session stream: every message kind in sequence through one Reader, then
// a clean io.EOF.
func TestStreamSequence(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf, Limits{})
	hdr, tensors := testBundle(4, 8, true)
	msgs := []*meshp2pb.StreamMessage{
		{Kind: &meshp2pb.StreamMessage_Open{Open: &meshp2pb.SessionOpen{SessionId: testSID, Epoch: 1, NCtxNeeded: 512,
			Route:    &meshp2pb.Route{NLayer: 2, Hops: []*meshp2pb.RouteHop{{PeerId: []byte("p"), Start: 0, End: 2, Addrs: []string{"/ip4/127.0.0.1/tcp/1"}}}},
			Sampling: &meshp2pb.SamplingParams{Temperature: 0.7, TopK: 40, Seed: 42}}}},
		{Kind: &meshp2pb.StreamMessage_Accept{Accept: &meshp2pb.SessionAccept{SessionId: testSID, Epoch: 1, Ok: true}}},
		actMsg(hdr),
		{Kind: &meshp2pb.StreamMessage_Token{Token: &meshp2pb.TokenFrame{SessionId: testSID, Epoch: 1, Token: 42, Position: 14}}},
		{Kind: &meshp2pb.StreamMessage_Error{Error: &meshp2pb.Error{Code: meshp2pb.ErrorCode_ERROR_CODE_NO_CAPACITY, FailedPeerId: []byte("p")}}},
		{Kind: &meshp2pb.StreamMessage_Cancel{Cancel: &meshp2pb.SessionCancel{SessionId: testSID}}},
		{Kind: &meshp2pb.StreamMessage_Close{Close: &meshp2pb.SessionClose{SessionId: testSID, Reason: "stop"}}},
	}
	for _, m := range msgs {
		var ts [][]byte
		if m.GetActivation() != nil {
			ts = tensors
		}
		if err := w.WriteStream(m, ts...); err != nil {
			t.Fatalf("WriteStream(%s): %v", kindName(m), err)
		}
	}
	r := NewReader(&buf, Limits{})
	for i, want := range msgs {
		got, ts, err := r.ReadStream()
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if !proto.Equal(got, want) {
			t.Fatalf("frame %d: got %v, want %v", i, got, want)
		}
		if want.GetActivation() != nil {
			if len(ts) != 2 || !bytes.Equal(ts[0], tensors[0]) || !bytes.Equal(ts[1], tensors[1]) {
				t.Fatalf("frame %d: tensors differ", i)
			}
		} else if ts != nil {
			t.Fatalf("frame %d: tensors on a %s message", i, kindName(got))
		}
	}
	if _, _, err := r.ReadStream(); err != io.EOF {
		t.Fatalf("after last frame: %v, want io.EOF", err)
	}
}

func TestReadActivationUnexpectedKeepsSync(t *testing.T) {
	var buf bytes.Buffer
	tok := &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: &meshp2pb.TokenFrame{Token: 5}}}
	if err := NewWriter(&buf, Limits{}).WriteStream(tok); err != nil {
		t.Fatal(err)
	}
	hdr, tensors := testBundle(1, 16, false)
	buf.Write(encodeActivation(t, hdr, tensors...))
	r := NewReader(&buf, Limits{})
	_, _, err := r.ReadActivation()
	var ue *UnexpectedMessageError
	if !errors.As(err, &ue) || !errors.Is(err, ErrUnexpectedMessage) || ue.Msg.GetToken().GetToken() != 5 {
		t.Fatalf("got %v, want UnexpectedMessageError carrying the token", err)
	}
	if _, _, err := r.ReadActivation(); err != nil {
		t.Fatalf("next activation after unexpected message: %v", err)
	}
}

func TestUnknownKindSkipsPayload(t *testing.T) {
	// Field 99 of StreamMessage: a message kind from a future version.
	future := []byte{0x9a, 0x06, 0x02, 0x08, 0x01} // tag 99 (bytes), len 2, {1: 1}
	var wire []byte
	wire = binary.BigEndian.AppendUint32(wire, uint32(len(future)))
	wire = binary.BigEndian.AppendUint32(wire, 5)
	wire = append(wire, future...)
	wire = append(wire, "XXXXX"...)
	hdr, tensors := testBundle(1, 4, false)
	wire = append(wire, encodeActivation(t, hdr, tensors...)...)
	r := NewReader(bytes.NewReader(wire), Limits{})
	m, ts, err := r.ReadStream()
	if err != nil || m.Kind != nil || ts != nil {
		t.Fatalf("future message: %v %v %v", m, ts, err)
	}
	if _, _, err := r.ReadActivation(); err != nil {
		t.Fatalf("frame after the future message: %v", err)
	}
}

func TestMessageRoundTrip(t *testing.T) {
	adv := &meshp2pb.CapabilityAdvert{
		PeerId: []byte("peer"), Network: "test", Roles: []meshp2pb.Role{meshp2pb.Role_ROLE_SHARD}, Seq: 9,
		Shards: []*meshp2pb.ShardAdvert{{ModelFingerprint: "ab12", NLayer: 32, Start: 0, End: 16,
			WireDtypes:       []meshp2pb.DType{meshp2pb.DType_DTYPE_F32, meshp2pb.DType_DTYPE_F16},
			Capacity:         &meshp2pb.ShardCapacity{FreeSessions: 3, MaxSessions: 4, NCtx: 4096, NBatch: 512},
			DecodeMsPerLayer: proto.Float32(0.25), HasVocab: true}},
	}
	var buf bytes.Buffer
	if err := WriteMessage(&buf, adv); err != nil {
		t.Fatal(err)
	}
	got := new(meshp2pb.CapabilityAdvert)
	if err := ReadMessage(&buf, got, Limits{}); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, adv) {
		t.Fatalf("got %v, want %v", got, adv)
	}
	if got.Shards[0].DecodeMsPerLayer == nil || got.Shards[0].PrefillMsPerLayer != nil {
		t.Fatal("optional field presence lost")
	}
}

func TestReadErrors(t *testing.T) {
	good, goodT := testBundle(2, 4, false)
	goodWire := encodeActivation(t, good, goodT...)
	payload := bytes.Join(goodT, nil)
	small := Limits{MaxHeader: 256, MaxPayload: 1024, MaxTensors: 2, MaxRows: 8}

	// mut returns a copy of the valid header changed by f, re-encoded as a
	// frame whose payload length follows the (changed) byte lengths.
	mut := func(f func(h *meshp2pb.ActivationHeader)) []byte {
		h := proto.Clone(good).(*meshp2pb.ActivationHeader)
		f(h)
		var n int64
		for _, ti := range h.Tensors {
			n += int64(ti.ByteLength)
		}
		p := make([]byte, n)
		copy(p, payload)
		return rawFrame(actMsg(h), p, -1, -1)
	}
	tensor := func(name string, dt meshp2pb.DType, n int64, shape ...int64) *meshp2pb.TensorInfo {
		return &meshp2pb.TensorInfo{Name: name, Dtype: dt, Shape: shape, ByteLength: uint64(n)}
	}

	cases := []struct {
		name string
		wire []byte
		lim  Limits
		want error
		code meshp2pb.ErrorCode
	}{
		{"empty stream", nil, Limits{}, io.EOF, meshp2pb.ErrorCode_ERROR_CODE_INTERNAL},
		{"truncated prefix", goodWire[:3], Limits{}, io.ErrUnexpectedEOF, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"truncated header", goodWire[:PrefixSize+5], Limits{}, io.ErrUnexpectedEOF, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"truncated payload", goodWire[:len(goodWire)-1], Limits{}, io.ErrUnexpectedEOF, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"header over limit", rawFrame(actMsg(good), payload, 257, -1), small, ErrFrameTooLarge, meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{"header length max uint32", rawFrame(actMsg(good), payload, math.MaxUint32, -1), Limits{}, ErrFrameTooLarge, meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{"payload over limit", rawFrame(actMsg(good), payload, -1, 1025), small, ErrFrameTooLarge, meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{"garbage header", append(binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 3), 0), 0xff, 0xff, 0xff), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"payload shorter than tensors", rawFrame(actMsg(good), payload[:8], -1, -1), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"payload longer than tensors", rawFrame(actMsg(good), append(bytes.Clone(payload), 0), -1, -1), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"byte_length vs shape", mut(func(h *meshp2pb.ActivationHeader) { h.Tensors[0].ByteLength -= 4 }), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"checksum mismatch", mut(func(h *meshp2pb.ActivationHeader) { h.Tensors[0].Crc32C ^= 1 }), Limits{}, ErrChecksum, meshp2pb.ErrorCode_ERROR_CODE_CHECKSUM_MISMATCH},
		{"too many tensors", mut(func(h *meshp2pb.ActivationHeader) {
			h.Tensors = []*meshp2pb.TensorInfo{tensor("a", 0, 4, 2, 0), tensor("b", 0, 0, 2, 0), tensor("c", 0, 0, 2, 0)}
		}), small, ErrFrameTooLarge, meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{"negative dim", mut(func(h *meshp2pb.ActivationHeader) { h.Tensors[0].Shape = []int64{2, -4} }), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"negative dim with zero", mut(func(h *meshp2pb.ActivationHeader) { h.Tensors[0].Shape = []int64{2, 0, -1} }), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"overflowing dims", mut(func(h *meshp2pb.ActivationHeader) { h.Tensors[0].Shape = []int64{2, 1 << 62, 1 << 62} }), Limits{}, ErrFrameTooLarge, meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{"max int64 dim", mut(func(h *meshp2pb.ActivationHeader) { h.Tensors[0].Shape = []int64{2, math.MaxInt64} }), Limits{}, ErrFrameTooLarge, meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{"rank 0", mut(func(h *meshp2pb.ActivationHeader) { h.Tensors[0].Shape = nil }), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"rank over limit", mut(func(h *meshp2pb.ActivationHeader) { h.Tensors[0].Shape = []int64{2, 1, 1, 1, 4} }), Limits{}, ErrFrameTooLarge, meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{"leading dim not n_rows", mut(func(h *meshp2pb.ActivationHeader) { h.Tensors[0].Shape = []int64{4, 2} }), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"unknown dtype", mut(func(h *meshp2pb.ActivationHeader) { h.Tensors[0].Dtype = 99 }), Limits{}, ErrUnsupportedDType, meshp2pb.ErrorCode_ERROR_CODE_UNSUPPORTED_DTYPE},
		{"n_rows zero", mut(func(h *meshp2pb.ActivationHeader) { h.NRows = 0 }), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"n_rows over limit", mut(func(h *meshp2pb.ActivationHeader) {
			h.NRows = 9
			h.Tensors[0] = tensor("l_out", 0, 9*4*4, 9, 4)
		}), small, ErrFrameTooLarge, meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{"positions overflow int32", mut(func(h *meshp2pb.ActivationHeader) { h.PosStart = math.MaxInt32 - 1 }), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"tokens vs rows", mut(func(h *meshp2pb.ActivationHeader) { h.Tokens = []int32{1, 2, 3} }), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"empty bundle", mut(func(h *meshp2pb.ActivationHeader) { h.Tensors = nil }), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"empty name", mut(func(h *meshp2pb.ActivationHeader) { h.Tensors[0].Name = "" }), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"long name", mut(func(h *meshp2pb.ActivationHeader) { h.Tensors[0].Name = string(make([]byte, 65)) }), Limits{}, ErrFrameTooLarge, meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{"duplicate names", mut(func(h *meshp2pb.ActivationHeader) {
			h.Tensors = append(h.Tensors, tensor("l_out", 0, 0, 2, 0))
		}), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"session id length", mut(func(h *meshp2pb.ActivationHeader) { h.SessionId = []byte("short") }), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"payload on a token message", rawFrame(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: &meshp2pb.TokenFrame{}}}, []byte{1}, -1, -1), Limits{}, ErrMalformed, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{"unknown kind, truncated payload", rawFrame(&meshp2pb.StreamMessage{}, []byte{1}, -1, 2), Limits{}, io.ErrUnexpectedEOF, meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ReadActivation(bytes.NewReader(tc.wire), tc.lim)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if tc.want != io.EOF && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrFrameTooLarge) &&
				!errors.Is(err, ErrChecksum) && !errors.Is(err, ErrUnsupportedDType) {
				t.Fatalf("%v wraps no frame sentinel", err)
			}
			if got := Code(err); got != tc.code {
				t.Fatalf("Code(%v) = %s, want %s", err, got, tc.code)
			}
		})
	}
}

func TestReadMessageRejectsPayload(t *testing.T) {
	hdr, tensors := testBundle(1, 4, false)
	wire := encodeActivation(t, hdr, tensors...)
	err := ReadMessage(bytes.NewReader(wire), new(meshp2pb.StreamMessage), Limits{})
	if !errors.Is(err, ErrMalformed) {
		t.Fatalf("got %v, want ErrMalformed", err)
	}
}

func TestWriteErrors(t *testing.T) {
	hdr, tensors := testBundle(2, 4, false)
	cases := []struct {
		name    string
		lim     Limits
		hdr     func() *meshp2pb.ActivationHeader
		tensors [][]byte
		want    error
	}{
		{"tensor count", Limits{}, func() *meshp2pb.ActivationHeader { return proto.Clone(hdr).(*meshp2pb.ActivationHeader) }, nil, ErrMalformed},
		{"bytes vs shape", Limits{}, func() *meshp2pb.ActivationHeader { return proto.Clone(hdr).(*meshp2pb.ActivationHeader) }, [][]byte{tensors[0][:4]}, ErrMalformed},
		{"payload limit", Limits{MaxPayload: 16}, func() *meshp2pb.ActivationHeader { return proto.Clone(hdr).(*meshp2pb.ActivationHeader) }, tensors, ErrFrameTooLarge},
		{"header limit", Limits{MaxHeader: 16}, func() *meshp2pb.ActivationHeader { return proto.Clone(hdr).(*meshp2pb.ActivationHeader) }, tensors, ErrFrameTooLarge},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			err := NewWriter(&buf, tc.lim).WriteActivation(tc.hdr(), tc.tensors...)
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if buf.Len() != 0 {
				t.Fatalf("wrote %d bytes despite the error", buf.Len())
			}
		})
	}
	var buf bytes.Buffer
	tok := &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: &meshp2pb.TokenFrame{}}}
	if err := NewWriter(&buf, Limits{}).WriteStream(tok, []byte{1}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("tensors on a token message: %v", err)
	}
}

// A peer declaring a huge payload but sending little must not make the
// reader allocate the declared size.
func TestDeclaredSizeDoesNotAllocate(t *testing.T) {
	const declared = 200 << 20
	h := &meshp2pb.ActivationHeader{SessionId: testSID, NRows: 1,
		Tensors: []*meshp2pb.TensorInfo{{Name: "l_out", Shape: []int64{1, declared / 4}, ByteLength: declared}}}
	wire := rawFrame(actMsg(h), make([]byte, 1000), -1, declared)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	_, _, err := ReadActivation(bytes.NewReader(wire), Limits{})
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %v, want truncation", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4<<20 {
		t.Fatalf("allocated %d bytes for a frame that delivered 1000", alloc)
	}
	// Same for a skipped unknown-kind frame.
	wire = rawFrame(&meshp2pb.StreamMessage{}, make([]byte, 1000), -1, declared)
	runtime.ReadMemStats(&before)
	_, _, err = NewReader(bytes.NewReader(wire), Limits{}).ReadStream()
	runtime.ReadMemStats(&after)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("got %v, want truncation", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 4<<20 {
		t.Fatalf("allocated %d bytes skipping a frame that delivered 1000", alloc)
	}
}

// The Reader reuses its payload buffer: steady-state reads of same-sized
// frames allocate only the header structs, never the payload again.
func TestReaderReusesBuffer(t *testing.T) {
	hdr, tensors := testBundle(64, 1024, false) // 256 KiB payload
	wire := encodeActivation(t, hdr, tensors...)
	src := bytes.NewReader(wire)
	r := NewReader(src, Limits{})
	read := func() {
		src.Reset(wire)
		if _, _, err := r.ReadActivation(); err != nil {
			t.Fatal(err)
		}
	}
	read()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range 10 {
		read()
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / 10; per > 16<<10 {
		t.Fatalf("%d bytes allocated per read of a %d-byte payload", per, len(tensors[0]))
	}
}

func TestCode(t *testing.T) {
	remote := FromProto(&meshp2pb.Error{Code: meshp2pb.ErrorCode_ERROR_CODE_STALE_EPOCH, Message: "old"})
	cases := []struct {
		err  error
		want meshp2pb.ErrorCode
	}{
		{nil, meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED},
		{fmt.Errorf("x: %w", ErrFrameTooLarge), meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE},
		{fmt.Errorf("x: %w", ErrChecksum), meshp2pb.ErrorCode_ERROR_CODE_CHECKSUM_MISMATCH},
		{fmt.Errorf("x: %w", ErrMalformed), meshp2pb.ErrorCode_ERROR_CODE_MALFORMED},
		{fmt.Errorf("x: %w", ErrUnsupportedDType), meshp2pb.ErrorCode_ERROR_CODE_UNSUPPORTED_DTYPE},
		{&UnexpectedMessageError{}, meshp2pb.ErrorCode_ERROR_CODE_UNEXPECTED_MESSAGE},
		{fmt.Errorf("x: %w", context.Canceled), meshp2pb.ErrorCode_ERROR_CODE_CANCELLED},
		{context.DeadlineExceeded, meshp2pb.ErrorCode_ERROR_CODE_TIMEOUT},
		{fmt.Errorf("read: %w", os.ErrDeadlineExceeded), meshp2pb.ErrorCode_ERROR_CODE_TIMEOUT},
		{fmt.Errorf("hop 2: %w", remote), meshp2pb.ErrorCode_ERROR_CODE_STALE_EPOCH},
		{errors.New("stream reset"), meshp2pb.ErrorCode_ERROR_CODE_INTERNAL},
	}
	for _, tc := range cases {
		if got := Code(tc.err); got != tc.want {
			t.Errorf("Code(%v) = %s, want %s", tc.err, got, tc.want)
		}
	}
	pe := ToProto(fmt.Errorf("read: %w", ErrChecksum))
	if pe.Code != meshp2pb.ErrorCode_ERROR_CODE_CHECKSUM_MISMATCH || !Retryable(pe.Code) || pe.Message == "" {
		t.Errorf("ToProto(checksum) = %v", pe)
	}
	if pe := ToProto(fmt.Errorf("hop: %w", remote)); pe.Code != meshp2pb.ErrorCode_ERROR_CODE_STALE_EPOCH || pe.Message != "old" {
		t.Errorf("ToProto(remote) = %v", pe)
	}
	if ToProto(nil) != nil || FromProto(nil) != nil {
		t.Error("nil must map to nil")
	}
}

func TestLimitsDefaults(t *testing.T) {
	d := DefaultLimits()
	if d.MaxHeader != DefaultMaxHeader || d.MaxPayload != DefaultMaxPayload || d.MaxTensors != DefaultMaxTensors ||
		d.MaxRank != DefaultMaxRank || d.MaxRows != DefaultMaxRows || d.MaxNameLen != DefaultMaxNameLen {
		t.Fatalf("DefaultLimits() = %+v", d)
	}
	if l := (Limits{MaxPayload: 1 << 40}).norm(); l.MaxPayload != math.MaxUint32 {
		t.Fatalf("MaxPayload not clamped to the prefix: %d", l.MaxPayload)
	}
}
