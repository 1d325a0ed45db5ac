package session

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/network"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// A seam whose peer stopped reading: Interrupt frees the blocked writer,
// Swap moves the seam to a fresh stream, and frames go there.
func TestSeamInterruptAndSwap(t *testing.T) {
	a, b := newTestHost(t), newTestHost(t)
	connectAll(a, b)
	pid := a.ProtocolID("seamtest", "1")
	got := make(chan *meshp2pb.StreamMessage, 1)
	streams := make(chan network.Stream, 2)
	b.SetStreamHandler(pid, func(s network.Stream) { streams <- s })
	open := func() network.Stream {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s, err := a.NewStream(ctx, b.ID(), pid)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	if err := NewSeam(nil, frame.Limits{}).Send(&meshp2pb.StreamMessage{}, 0); !errors.Is(err, errNoStream) {
		t.Fatalf("send without a stream: %v", err)
	}
	first := open()
	m := NewSeam(first, frame.Limits{})

	payload := make([]byte, 1<<20)
	sendErr := make(chan error, 1)
	go func() {
		hdr := &meshp2pb.ActivationHeader{SessionId: make([]byte, 16), Epoch: 1, NRows: 1,
			Tensors: []*meshp2pb.TensorInfo{{Name: BundleTensor, Dtype: meshp2pb.DType_DTYPE_F32, Shape: []int64{1, int64(len(payload) / 4)}}}}
		for {
			if err := m.SendActivation(hdr, payload, 0); err != nil {
				sendErr <- err
				return
			}
		}
	}()
	stalled := <-streams // arrives with the first frame; never read
	m.Interrupt(100 * time.Millisecond)
	if err := <-sendErr; err == nil {
		t.Fatal("blocked writer was not freed")
	}
	second := open()
	if old := m.Swap(second); old != first {
		t.Fatal("Swap did not return the previous stream")
	}
	_ = first.Reset()
	_ = stalled.Reset()
	go func() {
		s := <-streams
		msg, _, err := frame.NewReader(s, frame.Limits{}).ReadStream()
		if err == nil {
			got <- msg
		}
		close(got)
	}()
	want := &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Close{Close: &meshp2pb.SessionClose{SessionId: make([]byte, 16), Epoch: 1, Reason: "x"}}}
	if err := m.Send(want, time.Minute); err != nil {
		t.Fatal(err)
	}
	if msg := <-got; msg.GetClose().GetReason() != "x" {
		t.Fatalf("the new stream got %v", msg)
	}
	if !m.Is(second) {
		t.Fatal("the seam is not on the swapped-in stream")
	}
}
