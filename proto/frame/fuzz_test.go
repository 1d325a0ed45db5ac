package frame

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
	"google.golang.org/protobuf/proto"
)

// fuzzLimits keep every fuzz input small, so allocations stay bounded.
var fuzzLimits = Limits{MaxHeader: 4 << 10, MaxPayload: 1 << 20, MaxTensors: 4, MaxRows: 64}

func fuzzSeeds(f *testing.F) {
	hdr, tensors := testBundle(2, 4, true)
	wire := encodeActivation(f, hdr, tensors...)
	f.Add(wire)
	f.Add(wire[:len(wire)-1])
	f.Add(wire[:PrefixSize+3])
	f.Add(wire[:5])
	f.Add([]byte{})
	tok := &meshp2pb.ActivationHeader{SessionId: testSID, NRows: 2, Tokens: []int32{5, 6}}
	f.Add(encodeActivation(f, tok))
	bad := proto.Clone(hdr).(*meshp2pb.ActivationHeader)
	bad.Tensors[0].Shape = []int64{2, 1 << 62, 4}
	f.Add(rawFrame(actMsg(bad), bytes.Join(tensors, nil), -1, -1))
	f.Add(rawFrame(&meshp2pb.StreamMessage{}, []byte("skip"), -1, -1))
	f.Add(rawFrame(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: &meshp2pb.TokenFrame{Token: 1}}}, nil, -1, -1))
	f.Add(rawFrame(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Error{Error: &meshp2pb.Error{Code: 3, Message: "x"}}}, nil, -1, -1))
	f.Add(append(bytes.Clone(wire), wire...))
}

// FuzzReadActivation: reading arbitrary bytes never panics, and every frame
// it accepts is consistent and re-encodes to the same frame.
func FuzzReadActivation(f *testing.F) {
	fuzzSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		// Charged to a scope smaller than the payload limit: refusals
		// and reuse are exercised too.
		sc := &testScope{limit: fuzzLimits.MaxPayload / 2}
		r := NewReader(bytes.NewReader(data), fuzzLimits).ChargeTo(sc)
		for { // each iteration consumes >= PrefixSize bytes or ends
			m, tensors, err := r.ReadStream()
			if cap(r.payload) > r.charged || sc.used != r.charged {
				t.Fatalf("buffer cap %d, charged %d, scope holds %d", cap(r.payload), r.charged, sc.used)
			}
			if err != nil {
				if err != io.EOF && Code(err) == meshp2pb.ErrorCode_ERROR_CODE_INTERNAL {
					t.Fatalf("error without a frame code: %v", err)
				}
				return
			}
			hdr := m.GetActivation()
			if hdr == nil {
				if tensors != nil {
					t.Fatalf("tensors on a %s message", kindName(m))
				}
				continue
			}
			if len(tensors) != len(hdr.Tensors) {
				t.Fatalf("%d tensors for %d infos", len(tensors), len(hdr.Tensors))
			}
			total := 0
			for i, ti := range hdr.Tensors {
				if uint64(len(tensors[i])) != ti.ByteLength || Checksum(tensors[i]) != ti.Crc32C {
					t.Fatalf("tensor %d inconsistent with its header", i)
				}
				total += len(tensors[i])
			}
			if total > fuzzLimits.MaxPayload {
				t.Fatalf("accepted %d payload bytes over the limit", total)
			}
			var buf bytes.Buffer
			again := proto.Clone(hdr).(*meshp2pb.ActivationHeader)
			if err := NewWriter(&buf, fuzzLimits).WriteActivation(again, tensors...); err != nil {
				t.Fatalf("re-encoding an accepted frame: %v", err)
			}
			h2, t2, err := ReadActivation(&buf, fuzzLimits)
			if err != nil || !proto.Equal(h2, hdr) || len(t2) != len(tensors) {
				t.Fatalf("re-read: %v", err)
			}
		}
	})
}

// FuzzReadMessage: arbitrary bytes into ReadMessage never panic; accepted
// messages survive a write/read round trip. It covers every message a peer
// can send: session streams (SessionOpen/Accept/Close/Cancel, Error,
// activation headers, TokenFrame inside StreamMessage), adverts, route
// tickets, the tracker's route request/response and vocabulary transfers.
func FuzzReadMessage(f *testing.F) {
	fuzzSeeds(f)
	adv := &meshp2pb.CapabilityAdvert{PeerId: []byte("p"), Network: "n", Seq: 1,
		Shards: []*meshp2pb.ShardAdvert{{ModelFingerprint: "ff", NLayer: 4, End: 4, Capacity: &meshp2pb.ShardCapacity{NCtx: 1}}}}
	var buf bytes.Buffer
	if err := WriteMessage(&buf, adv); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, newMsg := range []func() proto.Message{
			func() proto.Message { return new(meshp2pb.StreamMessage) },
			func() proto.Message { return new(meshp2pb.CapabilityAdvert) },
			func() proto.Message { return new(meshp2pb.SignedRouteTicket) },
			func() proto.Message { return new(meshp2pb.RouteRequest) },
			func() proto.Message { return new(meshp2pb.RouteResponse) },
			func() proto.Message { return new(meshp2pb.VocabRequest) },
			func() proto.Message { return new(meshp2pb.VocabResponse) },
		} {
			msg := newMsg()
			err := ReadMessage(bytes.NewReader(data), msg, fuzzLimits)
			if err != nil {
				if err != io.EOF && !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrFrameTooLarge) {
					t.Fatalf("unexpected error class: %v", err)
				}
				continue
			}
			var out bytes.Buffer
			if err := NewWriter(&out, fuzzLimits).WriteMessage(msg); err != nil {
				t.Fatalf("re-encoding: %v", err)
			}
			back := newMsg()
			if err := ReadMessage(&out, back, fuzzLimits); err != nil || !proto.Equal(back, msg) {
				t.Fatalf("round trip: %v", err)
			}
		}
	})
}
