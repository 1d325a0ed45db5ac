package session

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"math"
	mrand "math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/neuron-tai/meshp2p/proto/frame"
	"github.com/neuron-tai/meshp2p/proto/meshp2pb"
)

// Fuzzing and property tests of the audit path: signed statements
// (OpenTranscript), fraud proofs (Judge), the cross-class rule
// (Tolerance.Compare) and the audit protocol's refusals (handleAudit).
//
// Fuzz with a bounded minimization, e.g.
//
//	go test ./session -run '^$' -fuzz '^FuzzJudgeProof$' -fuzztime 20s -fuzzminimizetime 200x
//
// every input is signed and verified (about a millisecond each under
// coverage), and the default minimization (60 s per new input) takes the
// whole run.

// fixedKey is a deterministic ed25519 key: fuzz workers re-sign with the
// same keys the seed corpus was made with, and the corpus is the same in
// every process.
func fixedKey(tb testing.TB, n byte) crypto.PrivKey {
	tb.Helper()
	k, err := crypto.UnmarshalEd25519PrivateKey(ed25519.NewKeyFromSeed(bytes.Repeat([]byte{n}, ed25519.SeedSize)))
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

func keyID(tb testing.TB, k crypto.PrivKey) peer.ID {
	tb.Helper()
	id, err := peer.IDFromPrivateKey(k)
	if err != nil {
		tb.Fatal(err)
	}
	return id
}

// proofSpec describes a hand-built session (buildProofSession).
type proofSpec struct {
	tokens int            // tokens generated (the head's input frames: a prefill, then tokens-1 decode steps)
	wire   meshp2pb.DType // the session's wire dtype
	lie    int            // the hop whose engine changes some of its outputs (-1: none)
	sid    byte           // the session id's bytes
}

// proofSession is a deterministic session on the 3-hop route of
// proofRanges, computed frame by frame the way the hops compute and
// digest it (independently of RunReplay), with every hop's statements
// signed by fixed keys.
type proofSession struct {
	origin crypto.PrivKey
	keys   map[peer.ID]crypto.PrivKey // the hops'
	open   *meshp2pb.SessionOpen
	known  []int32           // prompt and generated tokens
	proofs []*meshp2pb.Proof // hop i's whole session: every statement and input frame
}

var proofRanges = [][2]int{{0, 2}, {2, 4}, {4, 6}}

// proofEpoch is the hand-built sessions' signing time.
var proofEpoch = time.UnixMilli(1_700_000_000_000)

// lyingTamper changes every 7th output a little (the wrong activations of
// TestAuditCatchesWrongActivations).
func lyingTamper(n int, out *Output) {
	if n%7 != 3 {
		return
	}
	if len(out.Hidden) > 0 {
		out.Hidden[len(out.Hidden)-1] += 1e-3
	} else if out.Token != 0 {
		out.Token = 3
	}
}

func buildProofSession(tb testing.TB, ps proofSpec) *proofSession {
	tb.Helper()
	x := &proofSession{origin: fixedKey(tb, 1), keys: map[peer.ID]crypto.PrivKey{}}
	var rhops []*meshp2pb.RouteHop
	var hopKeys []crypto.PrivKey
	for i, r := range proofRanges {
		k := fixedKey(tb, byte(10+i))
		x.keys[keyID(tb, k)] = k
		hopKeys = append(hopKeys, k)
		rhops = append(rhops, &meshp2pb.RouteHop{PeerId: []byte(keyID(tb, k)), Start: uint32(r[0]), End: uint32(r[1])})
	}
	seed := uint64(cyclicSeed | 5)
	prompt := []int32{1, 2, 3, 4}
	sid := bytes.Repeat([]byte{ps.sid}, 16)
	open := &meshp2pb.SessionOpen{SessionId: sid, Epoch: 1, ModelFingerprint: fakeFP,
		Route:    &meshp2pb.Route{ModelFingerprint: fakeFP, NLayer: fakeNLay, Epoch: 1, Hops: rhops},
		Sampling: &meshp2pb.SamplingParams{Seed: seed}, MaxTokens: uint32(ps.tokens), WireDtype: ps.wire,
		NCtxNeeded: uint32(len(prompt) + ps.tokens), Transcripts: true}
	if err := SignOpen(open, x.origin, proofEpoch); err != nil {
		tb.Fatal(err)
	}
	x.open = open
	gen := reference(prompt, ps.tokens, seed)
	x.known = slices.Concat(prompt, gen)
	// The head's inputs, as the origin and the ring feed it.
	in := []*meshp2pb.RecordedFrame{{Header: &meshp2pb.ActivationHeader{SessionId: sid, Epoch: 1, NRows: uint32(len(prompt)),
		IsPrefill: true, LastChunk: true, Tokens: prompt}}}
	for s := 1; s < ps.tokens; s++ {
		in = append(in, &meshp2pb.RecordedFrame{Header: &meshp2pb.ActivationHeader{SessionId: sid, Epoch: 1, Step: uint64(s),
			PosStart: uint32(len(prompt) + s - 1), NRows: 1, LastChunk: true, Tokens: []int32{gen[s-1]}}})
	}
	for i, r := range proofRanges {
		tail := i == len(proofRanges)-1
		eng := newFakeEngine(r[0], r[1])
		if i == ps.lie {
			eng.tamper = lyingTamper
		}
		es, err := eng.OpenSession(Key{Origin: keyID(tb, x.origin), Epoch: 1}, EngineParams{KVTokens: int(open.GetNCtxNeeded()), Sampling: open.GetSampling()})
		if err != nil {
			tb.Fatal(err)
		}
		var (
			out    []*meshp2pb.RecordedFrame
			sts    []*meshp2pb.SignedTranscript
			sketch []*meshp2pb.SketchRow
			first  int
			h      = sha256.New()
		)
		sign := func(frames int, final bool) {
			st := &meshp2pb.Transcript{SessionId: sid, OriginPeerId: open.GetOriginPeerId(), Epoch: 1, HopIndex: uint32(i), PeerId: rhops[i].GetPeerId(),
				ModelFingerprint: fakeFP, Start: uint32(r[0]), End: uint32(r[1]), KernelClass: "fake", OpenDigest: OpenDigest(open), Window: uint32(len(sts)),
				FirstFrame: uint32(first), Frames: uint32(frames), InDigest: InputDigest(in[first : first+frames]), OutDigest: h.Sum(nil),
				Sketch: sketch, Final: final}
			s, err := SignTranscript(st, hopKeys[i])
			if err != nil {
				tb.Fatal(err)
			}
			sts = append(sts, s)
			first += frames
			h.Reset()
			sketch = nil
		}
		for j, f := range in {
			a := f.GetHeader()
			input := Input{Pos: int(a.GetPosStart())}
			if i == 0 {
				input.Tokens = a.GetTokens()
			} else {
				hidden, err := frame.ToF32(a.GetTensors()[0].GetDtype(), f.GetPayload(), nil)
				if err != nil {
					tb.Fatal(err)
				}
				input.Hidden = slices.Clone(hidden)
			}
			if tail {
				input.Sample = a.GetLastChunk() || !a.GetIsPrefill()
			}
			o, err := es.Forward(context.Background(), input)
			if err != nil {
				tb.Fatalf("hop %d frame %d: %v", i, j, err)
			}
			switch {
			case tail && input.Sample:
				if ps.lie < 0 && o.Token != gen[j] {
					tb.Fatalf("the tail sampled %d at frame %d, the reference %d", o.Token, j, gen[j])
				}
				tf := tokenFrame(a, o.Token, eng.IsEOG(o.Token))
				digestRing(h, &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: tf}})
			case !tail:
				hdr, payload := downFrame(a, o.Hidden, ps.wire, fakeEmbd)
				digestActivation(h, hdr, payload)
				s, err := sketchOf(hdr.GetTensors()[0].GetDtype(), payload, int(hdr.GetNRows()), fakeEmbd)
				if err != nil {
					tb.Fatal(err)
				}
				sketch = append(sketch, s)
				out = append(out, &meshp2pb.RecordedFrame{Header: hdr, Payload: slices.Clone(payload)})
			}
			if j+1-first == TranscriptWindow {
				sign(TranscriptWindow, false)
			}
		}
		sign(len(in)-first, true)
		es.Close()
		nEmbd := 0
		if i > 0 {
			nEmbd = fakeEmbd
		}
		x.proofs = append(x.proofs, &meshp2pb.Proof{Version: 1, Open: open, HopIndex: uint32(i), NEmbd: uint32(nEmbd), Statements: sts, Inputs: in})
		in = out
	}
	return x
}

// fetchProofs builds, for every hop of res's final epoch, the proof an
// audit of it would judge: its statements from the hop that checked them,
// its inputs from the hop before it (the head's own), as Origin.audit
// fetches them.
func fetchProofs(t *testing.T, o *Origin, res *Result) []*meshp2pb.Proof {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	open := res.lastOpen
	hops := open.GetRoute().GetHops()
	var out []*meshp2pb.Proof
	for hop := range hops {
		holder := hop + 1
		if hop == len(hops)-1 {
			holder = 0
		}
		recs, _, err := o.fetch(ctx, peer.ID(hops[holder].GetPeerId()), open, meshp2pb.AuditPart_AUDIT_PART_STATEMENTS)
		if err != nil {
			t.Fatalf("statements of hop %d: %v", hop, err)
		}
		source, part := hop-1, meshp2pb.AuditPart_AUDIT_PART_SENT
		if hop == 0 {
			source, part = 0, meshp2pb.AuditPart_AUDIT_PART_INPUTS
		}
		inRecs, frames, err := o.fetch(ctx, peer.ID(hops[source].GetPeerId()), open, part)
		if err != nil {
			t.Fatalf("inputs of hop %d: %v", hop, err)
		}
		if inRecs.GetTruncated() || len(recs.GetStatements()) == 0 || len(frames) == 0 {
			t.Fatalf("hop %d: %d statements, %d frames (truncated %v)", hop, len(recs.GetStatements()), len(frames), inRecs.GetTruncated())
		}
		out = append(out, &meshp2pb.Proof{Version: 1, Open: open, HopIndex: uint32(hop), NEmbd: uint32(nEmbd(frames)),
			Statements: recs.GetStatements(), Inputs: frames})
	}
	return out
}

// expectAcquitted judges p (and every prefix of its windows) on both
// kernel classes: no error, no conviction, every window replayed.
func expectAcquitted(t *testing.T, name string, p *meshp2pb.Proof) {
	t.Helper()
	b, err := proto.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	rt := &meshp2pb.Proof{}
	if err := proto.Unmarshal(b, rt); err != nil {
		t.Fatal(err)
	}
	windows, frames := 0, 0
	for _, s := range p.GetStatements() {
		st, err := OpenTranscript(s)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if st.GetFrames() > 0 {
			windows++
		}
		frames += int(st.GetFrames())
	}
	if frames != len(p.GetInputs()) {
		t.Fatalf("%s: statements cover %d frames, %d inputs", name, frames, len(p.GetInputs()))
	}
	for _, class := range []string{"fake", "other-class"} {
		v, err := Judge(context.Background(), rt, fakeEngines{class})
		if err != nil || v.Convicted || v.Proof != nil {
			t.Fatalf("%s (%s): %+v, %v", name, class, v, err)
		}
		tail := int(rt.GetHopIndex()) == len(rt.GetOpen().GetRoute().GetHops())-1
		if tail && class != "fake" && windows > 0 { // sampled tokens: inconclusive across classes, never passed
			if v.Inconclusive == "" {
				t.Fatalf("%s (%s): the tail across classes is not inconclusive: %+v", name, class, v)
			}
			continue
		}
		if v.Windows != windows || v.Frames != frames || v.Exact != (class == "fake") {
			t.Fatalf("%s (%s): %d windows of %d frames (exact %v), want %d of %d", name, class, v.Windows, v.Frames, v.Exact, windows, frames)
		}
		// Every prefix of the session's windows is a proof too.
		at := 0
		for i, s := range p.GetStatements() {
			st, _ := OpenTranscript(s)
			at += int(st.GetFrames())
			pre := proto.Clone(rt).(*meshp2pb.Proof)
			pre.Statements, pre.Inputs = pre.Statements[:i+1], pre.Inputs[:at]
			if v, err := Judge(context.Background(), pre, fakeEngines{class}); err != nil || v.Convicted {
				t.Fatalf("%s (%s): the first %d windows: %+v, %v", name, class, i+1, v, err)
			}
		}
	}
}

// An honest hop is never convicted: neither a hand-built session's hops
// nor the hops of real generations (plain, speculative, f16 wire), judged
// on the proofs an audit of each hop would build, on the hop's kernel
// class and on another.
func TestJudgeHonestProofNeverConvicts(t *testing.T) {
	t.Run("hand-built", func(t *testing.T) {
		for _, ps := range []proofSpec{
			{tokens: 40, lie: -1, sid: 1},
			{tokens: 32, lie: -1, sid: 2}, // an empty final window
			{tokens: 1, lie: -1, sid: 3},  // the prefill alone
			{tokens: 70, wire: meshp2pb.DType_DTYPE_F16, lie: -1, sid: 4},
		} {
			x := buildProofSession(t, ps)
			for i, p := range x.proofs {
				expectAcquitted(t, "hop "+itoa(i), p)
			}
			if err := checkHeadInputs(x.proofs[0].GetInputs(), x.known); err != nil {
				t.Fatal(err)
			}
		}
		// The same construction with a lying hop convicts it (the
		// construction is not vacuous).
		for lie := range proofRanges {
			x := buildProofSession(t, proofSpec{tokens: 40, lie: lie, sid: 9})
			v, err := Judge(context.Background(), x.proofs[lie], fakeEngines{"fake"})
			if err != nil || !v.Convicted || v.Proof == nil {
				t.Fatalf("lying hop %d: %+v, %v", lie, v, err)
			}
		}
	})
	for vi, tc := range []struct {
		name string
		spec bool
		wire meshp2pb.DType
	}{{"plain", false, 0}, {"spec", true, 0}, {"f16", false, meshp2pb.DType_DTYPE_F16}} {
		t.Run(tc.name, func(t *testing.T) {
			var hops []*fakeHop
			var stages [][]*fakeHop
			for _, r := range proofRanges {
				h := startHop(t, r[0], r[1], func(c *HopConfig) { c.KernelClass = "fake" })
				hops = append(hops, h)
				stages = append(stages, []*fakeHop{h})
			}
			o, c := newOrigin(t, stagePlanner{stages}, hops...)
			target := vi % len(proofRanges)
			l := auditing(o, c, func() int { return target }, func() int { return len(proofRanges) })
			prompt := []int32{1, 2, 3, 4, 5, 1, 2, 3}
			req := GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: prompt, MaxTokens: 70, WireDType: tc.wire,
				Sampling: &meshp2pb.SamplingParams{Seed: cyclicSeed | 5}}
			if tc.spec {
				req.Speculation = &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM, MaxDraft: 4, MaxWindows: 2}
			}
			res, err := o.Generate(context.Background(), req)
			if err != nil {
				t.Fatal(err)
			}
			proofs := fetchProofs(t, o, res)
			for i, p := range proofs {
				expectAcquitted(t, "hop "+itoa(i), p)
			}
			known := slices.Concat(prompt, res.Tokens)
			if err := checkHeadInputs(proofs[0].GetInputs(), known); err != nil {
				t.Fatal(err)
			}
			if tc.spec {
				// A head that claims another first row for a window
				// is caught: the check covers speculative windows too.
				windows, caught := 0, 0
				for i, f := range proofs[0].GetInputs() {
					if !f.GetHeader().GetVerify() || len(f.GetHeader().GetTokens()) == 0 {
						continue
					}
					windows++
					forged := proto.Clone(proofs[0]).(*meshp2pb.Proof)
					forged.Inputs[i].Header.Tokens[0]++
					if checkHeadInputs(forged.GetInputs(), known) != nil {
						caught++
					}
				}
				t.Logf("%d verification windows, a changed first row caught in %d", windows, caught)
				if caught == 0 {
					t.Fatal("no verification window's first row is checked")
				}
			}
			o.Audit.Wait()
			if reps := l.all(); len(reps) != 1 || reps[0].Outcome != AuditPassed || reps[0].Hop != target {
				t.Fatalf("audit reports %+v", reps)
			}
			waitReleased(t, hops...)
		})
	}
}

// checkStatementBounds fails t unless st, accepted from s, keeps every
// bound OpenTranscript documents.
func checkStatementBounds(t *testing.T, s *meshp2pb.SignedTranscript, st *meshp2pb.Transcript) {
	t.Helper()
	switch {
	case proto.Size(s) > MaxTranscriptBytes:
		t.Fatalf("accepted a statement of %d bytes", proto.Size(s))
	case len(st.GetSessionId()) != 16:
		t.Fatalf("accepted a session id of %d bytes", len(st.GetSessionId()))
	case len(st.GetInDigest()) != sha256.Size || len(st.GetOutDigest()) != sha256.Size:
		t.Fatalf("accepted digests of %d and %d bytes", len(st.GetInDigest()), len(st.GetOutDigest()))
	case st.GetFrames() > TranscriptWindow:
		t.Fatalf("accepted a window of %d frames", st.GetFrames())
	case st.GetFrames() < TranscriptWindow && !st.GetFinal():
		t.Fatalf("accepted a short window (%d frames) that is not final", st.GetFrames())
	case len(st.GetSketch()) > maxSketchRows:
		t.Fatalf("accepted %d sketch rows", len(st.GetSketch()))
	case st.GetStart() >= st.GetEnd():
		t.Fatalf("accepted layers %d-%d", st.GetStart(), st.GetEnd())
	}
	for i, r := range st.GetSketch() {
		if len(r.GetIndex()) != len(r.GetValue()) || len(r.GetIndex()) > SketchK {
			t.Fatalf("accepted sketch row %d of %d indices and %d values", i, len(r.GetIndex()), len(r.GetValue()))
		}
	}
}

// FuzzOpenTranscript: OpenTranscript takes any statement a neighbour or a
// proof file holds. It never panics, refuses with ErrTranscript, and what
// it accepts is signed by the peer it names and keeps the bounds. raw is
// a whole SignedTranscript; body is a statement signed here (as a hop
// would sign it: signer's peer id appended), so that the checks after the
// signature are reached; key picks the signer: 0 ed25519 (the peer id
// inlines the key), 1 ECDSA (public_key carried), 2 ECDSA with another
// key's public_key, 3 ed25519 with the signature broken (both refused).
func FuzzOpenTranscript(f *testing.F) {
	edKey := fixedKey(f, 42)
	ecKey, _, err := crypto.GenerateECDSAKeyPair(rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	otherEC, _, err := crypto.GenerateECDSAKeyPair(rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	// Small seeds (a short session: one final window per hop) keep the
	// minimization of new inputs short.
	x := buildProofSession(f, proofSpec{tokens: 3, lie: -1, sid: 7})
	for i, p := range x.proofs {
		s := p.GetStatements()[0]
		if i == 0 {
			raw, _ := proto.Marshal(s)
			f.Add(raw, []byte{}, uint8(0))
		}
		f.Add([]byte{}, s.GetTranscript(), uint8(i))
	}
	bad, _ := proto.Marshal(&meshp2pb.Transcript{SessionId: make([]byte, 16), InDigest: make([]byte, 32), OutDigest: make([]byte, 32), Frames: 3, Start: 1, End: 1,
		Sketch: []*meshp2pb.SketchRow{{Index: []uint32{1, 2}, Value: []float32{1}}}})
	f.Add([]byte{}, bad, uint8(0))
	f.Add([]byte{0x0a, 0x00}, []byte{}, uint8(2))
	f.Add([]byte{0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f}, []byte{0x60, 0x00, 0x80, 0x01, 0x01}, uint8(3))
	f.Fuzz(func(t *testing.T, raw, body []byte, which uint8) {
		var s meshp2pb.SignedTranscript
		if proto.Unmarshal(raw, &s) == nil {
			st, err := OpenTranscript(&s)
			if err != nil {
				if !errors.Is(err, ErrTranscript) {
					t.Fatalf("unwrapped error: %v", err)
				}
			} else {
				checkStatementBounds(t, &s, st)
			}
		}
		key := edKey
		if which%4 == 1 || which%4 == 2 {
			key = ecKey
		}
		id := keyID(t, key)
		b := protowire.AppendBytes(protowire.AppendTag(slices.Clone(body), 5, protowire.BytesType), []byte(id))
		sig, err := key.Sign(append([]byte(transcriptDomain), b...))
		if err != nil {
			t.Fatal(err)
		}
		signed := &meshp2pb.SignedTranscript{Transcript: b, Signature: sig}
		switch which % 4 {
		case 1:
			signed.PublicKey, _ = crypto.MarshalPublicKey(ecKey.GetPublic())
		case 2:
			signed.PublicKey, _ = crypto.MarshalPublicKey(otherEC.GetPublic())
		case 3:
			signed.Signature[int(which)%len(signed.Signature)] ^= 1 << (which % 8)
		}
		st, err := OpenTranscript(signed)
		if err != nil {
			if !errors.Is(err, ErrTranscript) {
				t.Fatalf("unwrapped error: %v", err)
			}
			return
		}
		if which%4 >= 2 {
			t.Fatalf("accepted a statement whose signature or key is not the signer's (case %d)", which%4)
		}
		if peer.ID(st.GetPeerId()) != id {
			t.Fatalf("accepted as signed by %s, signed by %s", peer.ID(st.GetPeerId()), id)
		}
		checkStatementBounds(t, signed, st)
	})
}

// mutateProof applies ops to p, two bytes each (what, argument): cuts,
// reorders and byte flips anyone can make, hops re-signing their own
// statements with other contents (a lying hop), and the origin re-signing
// its open with fields a replay does not read changed.
func mutateProof(t *testing.T, x *proofSession, p *meshp2pb.Proof, ops []byte) {
	resign := func(j int, change func(*meshp2pb.Transcript)) {
		st := &meshp2pb.Transcript{}
		if proto.Unmarshal(p.Statements[j].GetTranscript(), st) != nil {
			return
		}
		key := x.keys[peer.ID(st.GetPeerId())]
		if key == nil {
			return
		}
		change(st)
		s, err := SignTranscript(st, key)
		if err != nil {
			t.Fatal(err)
		}
		p.Statements[j] = s
	}
	for i := 0; i+1 < len(ops) && i < 32; i += 2 {
		arg := int(ops[i+1])
		sts, in := p.GetStatements(), p.GetInputs()
		switch ops[i] % 14 {
		case 0: // drop a statement
			if len(sts) > 0 {
				j := arg % len(sts)
				p.Statements = slices.Delete(slices.Clone(sts), j, j+1)
			}
		case 1: // cut the inputs
			p.Inputs = in[:arg%(len(in)+1)]
		case 2: // swap two statements
			if len(sts) > 1 {
				a, b := arg%len(sts), (arg/16)%len(sts)
				sts[a], sts[b] = sts[b], sts[a]
			}
		case 3: // flip a payload bit
			if len(in) > 0 {
				if pl := in[arg%len(in)].GetPayload(); len(pl) > 0 {
					pl[arg%len(pl)] ^= 1 << (arg % 8)
				}
			}
		case 4:
			p.HopIndex = uint32(arg % 4)
		case 5:
			p.NEmbd = uint32(arg % 8)
		case 6: // the hop signs another output
			if len(sts) > 0 {
				resign(arg%len(sts), func(st *meshp2pb.Transcript) {
					if len(st.GetOutDigest()) > 0 {
						st.OutDigest[arg%len(st.OutDigest)] ^= 1
					}
				})
			}
		case 7: // the hop signs that it received other inputs
			if len(in) == 0 {
				continue
			}
			j := (arg / 5) % len(in)
			a := in[j].GetHeader()
			if a == nil {
				continue
			}
			switch arg % 5 {
			case 0:
				a.PosStart++
			case 1:
				a.Step++
			case 2:
				a.IsPrefill = !a.IsPrefill
			case 3:
				if len(a.Tokens) > 0 {
					a.Tokens[0] ^= 1
				}
			case 4:
				if len(in[j].Payload) > 0 {
					in[j].Payload[0] ^= 0x80
				}
			}
			at := 0
			for k, s := range sts {
				st := &meshp2pb.Transcript{}
				if proto.Unmarshal(s.GetTranscript(), st) != nil {
					break
				}
				n := int(st.GetFrames())
				if j < at+n && at+n <= len(in) {
					resign(k, func(st *meshp2pb.Transcript) { st.InDigest = InputDigest(in[at : at+n]) })
					break
				}
				at += n
			}
		case 8: // the origin re-signs its open; the replay reads none of these
			open := p.GetOpen()
			if open == nil {
				continue
			}
			switch arg % 5 {
			case 0:
				open.MaxTokens = uint32(arg)
			case 1:
				if open.Route != nil {
					open.Route.NLayer++
				}
			case 2:
				open.Speculation = &meshp2pb.Speculation{Mode: meshp2pb.SpecMode_SPEC_MODE_NGRAM, MaxDraft: 4, MaxWindows: 2}
			case 3:
				open.OriginAddrs = append(open.OriginAddrs, "/ip4/127.0.0.1/tcp/1")
			case 4:
				open.HopIndex = uint32(arg) // not signed
			}
			if err := SignOpen(open, x.origin, proofEpoch.Add(time.Duration(arg)*time.Millisecond)); err != nil {
				t.Fatal(err)
			}
		case 9: // an input frame more
			if len(in) > 0 {
				p.Inputs = append(in, proto.Clone(in[len(in)-1]).(*meshp2pb.RecordedFrame))
			}
		case 10: // a statement re-signed as it was
			if len(sts) > 0 {
				resign(arg%len(sts), func(*meshp2pb.Transcript) {})
			}
		case 11: // a public key the peer id makes needless
			if len(sts) > 0 {
				sts[arg%len(sts)].PublicKey = []byte{byte(arg)}
			}
		case 12: // the hop names another kernel class (compared within the tolerance)
			if len(sts) > 0 {
				resign(arg%len(sts), func(st *meshp2pb.Transcript) { st.KernelClass = "class-" + itoa(arg%3) })
			}
		case 13: // the hop signs another sketch
			if len(sts) > 0 {
				resign((arg/16)%len(sts), func(st *meshp2pb.Transcript) {
					if len(st.GetSketch()) == 0 {
						return
					}
					r := st.Sketch[arg%len(st.Sketch)]
					if len(r.GetIndex()) == 0 {
						return
					}
					j := arg % len(r.Index)
					switch arg % 4 {
					case 0:
						r.Value[j] += float32(arg) / 64
					case 1:
						r.Index[j] += uint32(arg%3) + 1
					case 2:
						r.Index, r.Value = r.Index[:len(r.Index)-1], r.Value[:len(r.Value)-1]
					case 3:
						r.Value[j] = float32(math.NaN())
					}
				})
			}
		}
	}
}

// FuzzJudgeProof: Judge takes proof files from anyone. Whatever the bytes
// and whatever the mutations (mutateProof), it never panics, and when it
// convicts, the proof it returns is signed by the origin and the hop,
// convicts again on its own, and the windows up to the failing one are
// not all an honest hop's statements: statements that described the
// honest computation of their inputs never convict, however the proof
// around them is cut or re-signed by the origin.
func FuzzJudgeProof(f *testing.F) {
	// Short sessions (two windows, the second final) keep the seeds, and
	// the minimization of new inputs, small.
	honest := buildProofSession(f, proofSpec{tokens: TranscriptWindow + 2, lie: -1, sid: 5})
	lying := buildProofSession(f, proofSpec{tokens: 8, lie: 1, sid: 6})
	x := &proofSession{origin: honest.origin, keys: honest.keys}
	honestSet := map[string]bool{}
	for _, p := range honest.proofs {
		for _, s := range p.GetStatements() {
			honestSet[string(s.GetTranscript())] = true
		}
	}
	v, err := Judge(context.Background(), lying.proofs[1], fakeEngines{"fake"})
	if err != nil || !v.Convicted {
		f.Fatalf("the lying hop is not convicted: %+v, %v", v, err)
	}
	for _, s := range lying.proofs[1].GetStatements()[:v.Window] {
		honestSet[string(s.GetTranscript())] = true // replayed and matched
	}
	seeds := append(slices.Clone(honest.proofs), v.Proof, lying.proofs[1])
	for _, p := range seeds {
		b, err := proto.Marshal(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, []byte{}, false)
		f.Add(b, []byte{12, 0}, true)
		f.Add(b, []byte{13, 2, 13, 2, 13, 2, 13, 2, 12, 0}, false) // a sketch row emptied, another class: SketchRow(row, 0)
		f.Add(b, []byte{6, 1, 7, 12, 8, 2, 13, 0}, false)
		f.Add(b, []byte{0, 1, 1, 20, 3, 5, 9, 0, 10, 1, 11, 0, 4, 1, 5, 4}, false)
	}
	f.Add([]byte{}, []byte{}, false)
	f.Fuzz(func(t *testing.T, b, ops []byte, cross bool) {
		p := &meshp2pb.Proof{}
		if proto.Unmarshal(b, p) != nil {
			return
		}
		mutateProof(t, x, p, ops)
		class := "fake"
		if cross {
			class = "other-class"
		}
		_ = checkHeadInputs(p.GetInputs(), honest.known)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		v, err := Judge(ctx, p, fakeEngines{class})
		if err != nil || !v.Convicted {
			if v.Convicted || v.Proof != nil {
				t.Fatalf("a verdict with an error: %+v, %v", v, err)
			}
			return
		}
		if v.Proof == nil || v.Window < 0 || v.Window >= len(p.GetStatements()) || len(v.Proof.GetStatements()) != v.Window+1 {
			t.Fatalf("convicted at window %d of %d statements, proof %v", v.Window, len(p.GetStatements()), v.Proof != nil)
		}
		if _, err := VerifyOpenOrigin(v.Proof.GetOpen()); err != nil {
			t.Fatalf("convicted on an open its origin did not sign: %v", err)
		}
		for i, s := range v.Proof.GetStatements() {
			if _, err := OpenTranscript(s); err != nil {
				t.Fatalf("convicted on statement %d that does not verify: %v", i, err)
			}
		}
		allHonest := true
		for _, s := range p.GetStatements()[:v.Window+1] {
			allHonest = allHonest && honestSet[string(s.GetTranscript())]
		}
		if allHonest {
			t.Fatalf("an honest hop convicted (window %d, %s): %s", v.Window, class, v.Reason)
		}
		again, err := Judge(ctx, v.Proof, fakeEngines{class})
		if err != nil || !again.Convicted || again.Window != v.Window || again.Reason != v.Reason {
			t.Fatalf("the trimmed proof: %+v, %v; the first verdict %+v", again, err, v)
		}
	})
}

// bytesIn hands out a fuzz input's bytes (zeros when they run out).
type bytesIn struct{ b []byte }

func (s *bytesIn) next() byte {
	if len(s.b) == 0 {
		return 0
	}
	c := s.b[0]
	s.b = s.b[1:]
	return c
}

var specialF32 = []float32{0, float32(math.Copysign(0, -1)), 1, -1, float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)),
	math.MaxFloat32, -math.MaxFloat32, math.SmallestNonzeroFloat32, 1e-3, 0.5, 100, -100, 65504, -65504}

// f32 is a special value, a small integer, or any 32 bits.
func (s *bytesIn) f32() float32 {
	c := s.next()
	switch {
	case int(c) < len(specialF32):
		return specialF32[c]
	case c < 128:
		return float32(int(c) - 72)
	}
	return math.Float32frombits(binary.LittleEndian.Uint32([]byte{s.next(), s.next(), s.next(), s.next()}))
}

// magnitude orders SketchRow's entries (NaN largest).
func magnitude(v float32) float64 {
	m := math.Abs(float64(v))
	if math.IsNaN(m) {
		return math.Inf(1)
	}
	return m
}

// FuzzToleranceCompare: the cross-class rule takes any sketch and replay
// rows (NaN, ±Inf, indices past the row, empty rows, fewer or more rows)
// without panicking; SketchRow keeps its order and size; and a replay
// compared with its own sketch always fits (finite rows: a NaN or ±Inf
// entry never fits, not even itself). Signed rows have as many values as
// indices, as OpenTranscript admits them (Compare indexes Value by the
// positions of Index).
func FuzzToleranceCompare(f *testing.F) {
	f.Add([]byte{1, 2, 0, 16, 1, 17}, []byte{1, 4, 16, 17, 18, 19}, 0.05, 0.0, 6)
	f.Add([]byte{2, 3, 9, 4, 0, 5, 200, 6, 1, 0, 0}, []byte{2, 0, 3, 4, 5, 6}, 0.0, 0.1, 8)
	f.Add([]byte{1, 9, 0, 4, 1, 5, 2, 6, 3, 4, 4, 5, 5, 6, 6, 4, 7, 5, 8, 6}, []byte{1, 12, 4, 5, 6, 4, 5, 6, 4, 5, 6, 4, 5, 6}, math.NaN(), math.Inf(1), -3)
	f.Add([]byte{}, []byte{3, 0, 1, 200, 1, 2, 3, 4}, 1.0, 1.0, 0)
	f.Fuzz(func(t *testing.T, sig, rep []byte, abs, rel float64, minOverlap int) {
		in := &bytesIn{sig}
		var signed []*meshp2pb.SketchRow
		for range in.next() % 5 {
			r := &meshp2pb.SketchRow{}
			for range in.next() % (SketchK + 2) {
				r.Index = append(r.Index, uint32(in.next()))
				r.Value = append(r.Value, in.f32())
			}
			signed = append(signed, r)
		}
		in = &bytesIn{rep}
		var replay [][]float32
		finite := true
		for range in.next() % 5 {
			row := make([]float32, in.next()%24)
			for i := range row {
				row[i] = in.f32()
				finite = finite && !math.IsNaN(float64(row[i])) && !math.IsInf(float64(row[i]), 0)
			}
			replay = append(replay, row)
		}
		_ = SketchTolerance.Compare(signed, replay)
		_ = Tolerance{Abs: abs, Rel: rel, MinOverlap: minOverlap}.Compare(signed, replay)
		var own []*meshp2pb.SketchRow
		for _, row := range replay {
			for _, k := range []int{0, 1, SketchK, len(row) + 1} {
				s := SketchRow(row, k)
				if len(s.GetIndex()) != min(k, len(row)) || len(s.GetValue()) != len(s.GetIndex()) {
					t.Fatalf("SketchRow(%v, %d): %d indices, %d values", row, k, len(s.GetIndex()), len(s.GetValue()))
				}
				for j, idx := range s.GetIndex() {
					if int(idx) >= len(row) || slices.Index(s.GetIndex(), idx) != j ||
						math.Float32bits(s.GetValue()[j]) != math.Float32bits(row[idx]) ||
						(j > 0 && magnitude(row[s.GetIndex()[j-1]]) < magnitude(row[idx])) {
						t.Fatalf("SketchRow(%v, %d) = %v", row, k, s)
					}
				}
			}
			own = append(own, SketchRow(row, SketchK))
		}
		if !finite {
			return
		}
		if why := SketchTolerance.Compare(own, replay); why != "" {
			t.Fatalf("rows do not fit their own sketch: %s (%v)", why, replay)
		}
		if abs >= 0 && rel >= 0 && !math.IsInf(abs, 0) && !math.IsInf(rel, 0) {
			if why := (Tolerance{Abs: abs, Rel: rel, MinOverlap: minOverlap}).Compare(own, replay); why != "" {
				t.Fatalf("rows do not fit their own sketch (tolerance %g, %g, %d): %s", abs, rel, minOverlap, why)
			}
		}
	})
}

// auditExchange opens an audit stream from from to to, sends with send,
// closes its side and returns the first reply and how many frames followed
// it (nil and the error when none came).
func auditExchange(t *testing.T, from *testHost, to peer.ID, send func(s network.Stream) error) (*meshp2pb.StreamMessage, int, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := from.NewStream(ctx, to, from.ProtocolID(ProtoAudit, ProtoVersion))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Reset() }()
	_ = s.SetDeadline(time.Now().Add(10 * time.Second))
	if err := send(s); err != nil {
		t.Fatal(err)
	}
	_ = s.CloseWrite()
	r := frame.NewReader(s, frame.Limits{})
	msg, _, err := r.ReadStream()
	if err != nil {
		return nil, 0, err
	}
	n := 0
	for {
		m, _, err := r.ReadStream()
		if err != nil {
			break
		}
		if m.GetActivation() == nil && m.GetTranscript() == nil && m.GetToken() == nil && m.GetWindowResult() == nil {
			t.Fatalf("after the records: %v", m)
		}
		n++
	}
	return msg, n, nil
}

func sendMsg(m *meshp2pb.StreamMessage) func(network.Stream) error {
	return func(s network.Stream) error { return frame.NewWriter(s, frame.Limits{}).WriteStream(m) }
}

func fetchMsg(sid []byte, epoch uint64, part meshp2pb.AuditPart) *meshp2pb.StreamMessage {
	return &meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_AuditFetch{AuditFetch: &meshp2pb.AuditFetch{SessionId: sid, Epoch: epoch, Part: part}}}
}

// The audit protocol serves a session's records to its origin only, and
// answers anything else with an AuditRecords error and nothing after it.
func TestAuditFetchRefusals(t *testing.T) {
	h1 := startHop(t, 0, 3, func(c *HopConfig) { c.KernelClass = "fake" })
	h2 := startHop(t, 3, 6, func(c *HopConfig) { c.KernelClass = "fake" })
	pl := stagePlanner{[][]*fakeHop{{h1}, {h2}}}
	run := func() (*testHost, *meshp2pb.SessionOpen) {
		o, c := newOrigin(t, pl, h1, h2)
		// Transcripts asked for, no audit drawn: the records stay untouched.
		o.Audit = &Auditor{Rate: 1, Engines: fakeEngines{"fake"}, Protocol: c.ProtocolID(ProtoAudit, ProtoVersion), Draw: func() float64 { return 1 }}
		res, err := o.Generate(context.Background(), GenerateRequest{Fingerprint: fakeFP, NLayer: fakeNLay, Prompt: []int32{1, 2, 3, 4}, MaxTokens: 12,
			Sampling: &meshp2pb.SamplingParams{Seed: cyclicSeed | 5}})
		if err != nil {
			t.Fatal(err)
		}
		return c, res.lastOpen
	}
	c, open := run()
	c2, open2 := run() // another origin with records on the same hops
	other := newTestHost(t)
	connectAll(other, h1.host, h2.host)
	sid, epoch := open.GetSessionId(), open.GetEpoch()

	served := func(from *testHost, to *fakeHop, o *meshp2pb.SessionOpen, part meshp2pb.AuditPart) (int, int) {
		t.Helper()
		m, n, err := auditExchange(t, from, to.host.ID(), sendMsg(fetchMsg(o.GetSessionId(), o.GetEpoch(), part)))
		rec := m.GetAuditRecords()
		if err != nil || rec == nil || rec.GetError() != nil || int(rec.GetFrames()) != n {
			t.Fatalf("origin fetch of %s: %v, %v (%d frames followed)", part, m, err, n)
		}
		if part == meshp2pb.AuditPart_AUDIT_PART_STATEMENTS { // one message each
			return n, 0
		}
		return len(rec.GetStatements()), n
	}
	refused := func(name string, from *testHost, to *fakeHop, send func(network.Stream) error, want meshp2pb.ErrorCode) {
		t.Helper()
		m, n, err := auditExchange(t, from, to.host.ID(), send)
		if err != nil {
			if want != meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED {
				t.Fatalf("%s: no answer: %v", name, err)
			}
			return // garbage may get no answer, only a closed stream
		}
		rec := m.GetAuditRecords()
		switch {
		case rec == nil || rec.GetError() == nil:
			t.Fatalf("%s: answered %v", name, m)
		case want != meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED && rec.GetError().GetCode() != want:
			t.Fatalf("%s: %v, want %v", name, rec.GetError(), want)
		case len(rec.GetStatements()) > 0 || rec.GetFrames() > 0 || n > 0:
			t.Fatalf("%s: refused, yet %d statements and %d frames came (%d announced)", name, len(rec.GetStatements()), n, rec.GetFrames())
		case peer.ID(rec.GetError().GetPeerId()) != to.host.ID():
			t.Fatalf("%s: error names %s", name, peer.ID(rec.GetError().GetPeerId()))
		}
	}

	// The origins get their records.
	if sts, _ := served(c, h1, open, meshp2pb.AuditPart_AUDIT_PART_STATEMENTS); sts == 0 {
		t.Fatal("the head holds no statements of the tail")
	}
	if sts, _ := served(c, h2, open, meshp2pb.AuditPart_AUDIT_PART_STATEMENTS); sts == 0 {
		t.Fatal("the tail holds no statements of the head")
	}
	if _, n := served(c, h1, open, meshp2pb.AuditPart_AUDIT_PART_SENT); n == 0 {
		t.Fatal("the head kept no frames it sent")
	}
	if _, n := served(c2, h1, open2, meshp2pb.AuditPart_AUDIT_PART_INPUTS); n == 0 {
		t.Fatal("the head kept no inputs")
	}
	if _, n := served(c, h2, open, meshp2pb.AuditPart_AUDIT_PART_RING); n != 12 {
		t.Fatalf("the tail kept %d of the 12 tokens it sent the head", n)
	}
	if _, n := served(c, h1, open, meshp2pb.AuditPart_AUDIT_PART_RING); n != 0 {
		t.Fatalf("the head kept %d ring messages of its own", n)
	}

	unknown := meshp2pb.ErrorCode_ERROR_CODE_SESSION_UNKNOWN
	bad := meshp2pb.ErrorCode_ERROR_CODE_BAD_REQUEST
	parts := []meshp2pb.AuditPart{meshp2pb.AuditPart_AUDIT_PART_SENT, meshp2pb.AuditPart_AUDIT_PART_INPUTS, meshp2pb.AuditPart_AUDIT_PART_STATEMENTS, meshp2pb.AuditPart_AUDIT_PART_RING}
	for _, h := range []*fakeHop{h1, h2} {
		for _, part := range parts {
			// Nobody but the origin reads a session's records: not a
			// stranger, not another origin with records of its own here.
			refused("a stranger", other, h, sendMsg(fetchMsg(sid, epoch, part)), unknown)
			refused("another origin", c2, h, sendMsg(fetchMsg(sid, epoch, part)), unknown)
			refused("the other way", c, h, sendMsg(fetchMsg(open2.GetSessionId(), open2.GetEpoch(), part)), unknown)
			refused("another epoch", c, h, sendMsg(fetchMsg(sid, epoch+1, part)), unknown)
		}
		// Malformed fetches.
		refused("no part", c, h, sendMsg(fetchMsg(sid, epoch, meshp2pb.AuditPart_AUDIT_PART_UNSPECIFIED)), bad)
		refused("unknown part", c, h, sendMsg(fetchMsg(sid, epoch, 42)), bad)
		for _, n := range []int{0, 15, 17} {
			refused("a session id of "+itoa(n)+" bytes", c, h, sendMsg(fetchMsg(make([]byte, n), epoch, meshp2pb.AuditPart_AUDIT_PART_STATEMENTS)), bad)
		}
		refused("not a fetch", c, h, sendMsg(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Token{Token: &meshp2pb.TokenFrame{SessionId: sid, Epoch: epoch}}}), bad)
		refused("an open", c, h, sendMsg(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_Open{Open: open}}), bad)
		refused("a message of no known kind", c, h, sendMsg(&meshp2pb.StreamMessage{}), bad)
		refused("records", c, h, sendMsg(&meshp2pb.StreamMessage{Kind: &meshp2pb.StreamMessage_AuditRecords{AuditRecords: &meshp2pb.AuditRecords{Frames: 3}}}), bad)
		// Garbage: an error or a closed stream, never records, and the
		// hop still serves.
		raw := func(b []byte) func(network.Stream) error {
			return func(s network.Stream) error { _, err := s.Write(b); return err }
		}
		refused("nothing", c, h, raw(nil), meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED)
		refused("a header over the limit", c, h, raw([]byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0}), meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE)
		refused("a payload over the limit", c, h, raw([]byte{0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}), meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE)
		refused("a truncated header", c, h, raw([]byte{0, 0, 0, 50, 0, 0, 0, 0, 1, 2}), meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED)
		refused("a header that is no message", c, h, raw([]byte{0, 0, 0, 3, 0, 0, 0, 0, 0xff, 0xff, 0xff}), meshp2pb.ErrorCode_ERROR_CODE_MALFORMED)
		// A well-formed fetch, but with payload bytes a fetch may not carry.
		good, _ := proto.Marshal(fetchMsg(sid, epoch, meshp2pb.AuditPart_AUDIT_PART_STATEMENTS))
		withPayload := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, uint32(len(good))), 4)
		withPayload = append(append(withPayload, good...), 1, 2, 3, 4)
		refused("a fetch with a payload", c, h, raw(withPayload), meshp2pb.ErrorCode_ERROR_CODE_FRAME_TOO_LARGE) // read with the first-frame limits
		rng := mrand.New(mrand.NewPCG(7, uint64(len(h.host.ID()))))
		for range 8 {
			b := make([]byte, rng.IntN(64))
			for i := range b {
				b[i] = byte(rng.UintN(256))
			}
			if len(b) >= 8 && rng.IntN(2) == 0 { // a plausible prefix
				binary.BigEndian.PutUint32(b, uint32(len(b)-8))
				binary.BigEndian.PutUint32(b[4:], 0)
			}
			refused("random bytes", c, h, raw(b), meshp2pb.ErrorCode_ERROR_CODE_UNSPECIFIED)
		}
	}
	if sts, _ := served(c, h1, open, meshp2pb.AuditPart_AUDIT_PART_STATEMENTS); sts == 0 {
		t.Fatal("the head no longer serves its origin")
	}
	if sts, _ := served(c2, h2, open2, meshp2pb.AuditPart_AUDIT_PART_STATEMENTS); sts == 0 {
		t.Fatal("the tail no longer serves its origin")
	}
}
