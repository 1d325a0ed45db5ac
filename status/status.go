// Package status is the document `GET /api/status` serves and
// `meshp2p status --json` prints: this node and its view of the swarm
// (models, per-layer coverage, peers, paths, recent routes). It has no cgo
// and no metrics library; the node fills it from its route table, its p2p
// host and a Recorder of its sessions.
package status

import (
	"strings"
	"time"
)

// Version is the document's format version; it changes when a field
// changes meaning or goes away (new fields do not change it).
const Version = 1

// Document is one snapshot.
type Document struct {
	Version  int       `json:"version"`
	Time     time.Time `json:"time"`
	Self     Self      `json:"self"`
	Models   []Model   `json:"models"`
	Peers    []Peer    `json:"peers"`
	Routes   []Route   `json:"routes"` // recent sessions this node took part in, newest first
	Counters Counters  `json:"counters"`
	// Demand is the swarm's demand per model as this node merged it from
	// the peers' gossiped reports, with the models peers offer to load
	// (docs/placement.md "Many models"): served and offered models first,
	// then by requests, at most MaxDemandModels.
	Demand []ModelDemand `json:"demand"`
}

// ModelDemand is one model's demand (per second, decayed; package
// demand) and state.
type ModelDemand struct {
	Fingerprint  string  `json:"fingerprint"`
	Name         string  `json:"name,omitempty"`
	Requests     float64 `json:"requests_per_sec"`
	Queued       float64 `json:"queued_per_sec"`
	Refused      float64 `json:"refused_per_sec"`
	TokensPerSec float64 `json:"tokens_per_sec"`
	// Offers: peers offering to load it (multi-model nodes serving another model).
	Offers int `json:"offers"`
	// State: "served" (a route covers it), "warming" (asked for, no
	// route, offered), "warmable" (offered, not asked for), "unserved"
	// (asked for, nobody serves or offers it).
	State string `json:"state"`
}

// Self is the node that wrote the document.
type Self struct {
	PeerID      string   `json:"peer_id"`
	Role        string   `json:"role"` // "node", "client", "tracker"
	Network     string   `json:"network"`
	Addrs       []string `json:"addrs"`
	Model       string   `json:"model,omitempty"`
	Fingerprint string   `json:"fingerprint,omitempty"`
	Start       int      `json:"start"`
	End         int      `json:"end"`
	NLayer      int      `json:"n_layer,omitempty"`
	Sessions    int      `json:"sessions"`     // open on this hop
	MaxSessions int      `json:"max_sessions"` // 0: serves nothing
	KVUsed      int      `json:"kv_cells_used"`
	KVTotal     int      `json:"kv_cells_total"`
	MsPerLayer  float32  `json:"decode_ms_per_layer,omitempty"`
	// Placement: what automatic placement is doing (nil: not a node, or
	// fixed --layers and no move in progress).
	Placement *Placement `json:"placement,omitempty"`
}

// Placement is a node's window and any move in progress
// (docs/placement.md); BudgetBytes is 0 for a node given --layers.
type Placement struct {
	BudgetBytes int64 `json:"budget_bytes"`
	Start       int   `json:"start"` // the window served now
	End         int   `json:"end"`
	// Loading is the window being loaded (a move or the first load);
	// Draining the one being left: it admits no new session and is
	// released once its sessions end or re-route.
	Loading    *Window `json:"loading,omitempty"`
	Draining   *Window `json:"draining,omitempty"`
	Moves      int     `json:"moves"`
	LastReason string  `json:"last_reason,omitempty"`
	// HealPlan is the multi-node plan the last check computed while the
	// model has no route ("": none; docs/placement.md).
	HealPlan string `json:"heal_plan,omitempty"`
	// ModelReason is a multi-model node's last choice between its models
	// ("": one model).
	ModelReason string `json:"model_reason,omitempty"`
}

// Window is a layer range [Start, End).
type Window struct {
	Start int `json:"start"`
	End   int `json:"end"`
}

// Model is one model on offer, with its coverage by live shards.
type Model struct {
	Fingerprint string `json:"fingerprint"`
	Name        string `json:"name"`
	Arch        string `json:"arch,omitempty"`
	NLayer      int    `json:"n_layer"`
	// Routable: a route over live shards covers every layer; else Missing
	// says which layers lack one.
	Routable bool   `json:"routable"`
	Missing  string `json:"missing,omitempty"`
	// Replicas[i] is how many live shards hold layer i.
	Replicas []int   `json:"replicas"`
	Runs     []Run   `json:"runs"` // maximal layer spans of equal replica count
	Gaps     []Run   `json:"gaps"` // spans no live shard holds (Replicas 0)
	Shards   []Shard `json:"shards"`
}

// Run is the half-open layer span [Start, End) held by Replicas shards.
type Run struct {
	Start    int `json:"start"`
	End      int `json:"end"`
	Replicas int `json:"replicas"`
}

// Shard is one peer's layer range of a model.
type Shard struct {
	Peer  string `json:"peer"`
	Self  bool   `json:"self,omitempty"`
	Start int    `json:"start"`
	End   int    `json:"end"`
	// Live: connected now, or answered the probe's dial and ping. A dead
	// peer's advert lingers until it expires; it does not count as
	// coverage.
	Live bool `json:"live"`
	// Planned: announced by a node choosing or moving its window, not
	// loaded yet (no session slot; docs/placement.md); not coverage.
	Planned      bool    `json:"planned,omitempty"`
	Path         string  `json:"path"` // "direct", "relayed", "none"
	RTTMs        float64 `json:"rtt_ms,omitempty"`
	FreeSessions uint32  `json:"free_sessions"`
	MaxSessions  uint32  `json:"max_sessions"`
	FreeKV       uint64  `json:"free_kv_tokens"`
	Load         float64 `json:"load"` // 1 - free/max sessions
	MsPerLayer   float32 `json:"decode_ms_per_layer"`
	// TokensPerSec is the shard's advertised single-row speed over its
	// layers (0: unknown).
	TokensPerSec float64 `json:"tokens_per_sec,omitempty"`
	HasVocab     bool    `json:"has_vocab"`
	// KernelClass is the shard's engine kernel class (engine.KernelClass;
	// empty from older nodes): shards of one class compute bitwise the
	// same rows, across classes only to rounding.
	KernelClass string `json:"kernel_class,omitempty"`
	// Backend and Device are KernelClass parsed by BackendOf: the device
	// class that runs the shard's layers ("cpu", "vulkan", "cuda") and,
	// for a GPU, the device as its backend describes it (empty for the
	// CPU and for older nodes).
	Backend string `json:"backend,omitempty"`
	Device  string `json:"device,omitempty"`
}

// Peer is one peer this node knows, from adverts or connections.
type Peer struct {
	ID     string   `json:"id"`
	Live   bool     `json:"live"`
	Path   string   `json:"path"`
	RTTMs  float64  `json:"rtt_ms,omitempty"`
	Agent  string   `json:"agent,omitempty"`
	Layers []string `json:"layers,omitempty"` // "<model> A-B"
}

// Route is a session this node ran a hop of (HopIndex ≥ 0) or, as an
// origin, opened (HopIndex -1).
type Route struct {
	Time        time.Time `json:"time"`
	Fingerprint string    `json:"fingerprint"`
	Epoch       uint64    `json:"epoch"`
	Reroute     bool      `json:"reroute"` // epoch > 1: the origin routed around a failed hop
	HopIndex    int       `json:"hop_index"`
	Hops        []Hop     `json:"hops"`
}

// Hop is one hop of a route.
type Hop struct {
	Peer  string `json:"peer"`
	Start int    `json:"start"`
	End   int    `json:"end"`
	Path  string `json:"path,omitempty"` // how this node reaches it now
}

// Counters are running totals since the node started (the dashboard turns
// their differences into rates).
type Counters struct {
	SessionsAdmitted uint64 `json:"sessions_admitted"`
	SessionsRefused  uint64 `json:"sessions_refused"`
	SessionsActive   int    `json:"sessions_active"`
	TokensServed     uint64 `json:"tokens_served"`   // as head, to origins
	DecodeRows       uint64 `json:"decode_rows"`     // decode steps computed on this hop
	Reroutes         uint64 `json:"reroutes"`        // sessions re-opened here with epoch > 1, or re-routes by this origin
	Generations      uint64 `json:"generations"`     // as origin
	TokensReceived   uint64 `json:"tokens_received"` // as origin, as they arrive
	// Speculative decoding as the head of routes: verification windows
	// answered, proposed tokens verified, and of them accepted.
	SpecWindows  uint64 `json:"spec_windows"`
	SpecProposed uint64 `json:"spec_proposed"`
	SpecAccepted uint64 `json:"spec_accepted"`
	// Audits this node ran as an origin (docs/trust.md), by outcome:
	// failed ones convicted a hop.
	AuditsPassed       uint64 `json:"audits_passed"`
	AuditsFailed       uint64 `json:"audits_failed"`
	AuditsInconclusive uint64 `json:"audits_inconclusive"`
}

// Coverage computes per-layer replica counts, runs and gaps of nLayer
// layers from live, loaded shard ranges (clamped to [0, nLayer)).
func Coverage(nLayer int, shards []Shard) (replicas []int, runs, gaps []Run) {
	if nLayer <= 0 || nLayer > 1<<16 {
		return nil, nil, nil
	}
	replicas = make([]int, nLayer)
	for _, s := range shards {
		if !s.Live || s.Planned {
			continue
		}
		for l := max(0, s.Start); l < min(nLayer, s.End); l++ {
			replicas[l]++
		}
	}
	for l := 0; l < nLayer; {
		e := l
		for e < nLayer && replicas[e] == replicas[l] {
			e++
		}
		r := Run{Start: l, End: e, Replicas: replicas[l]}
		runs = append(runs, r)
		if r.Replicas == 0 {
			gaps = append(gaps, r)
		}
		l = e
	}
	if runs == nil {
		runs = []Run{}
	}
	if gaps == nil {
		gaps = []Run{}
	}
	return replicas, runs, gaps
}

// BackendOf parses a kernel class (engine.KernelClass, engine.Device's
// KernelClass) into its backend, the text before the first '/' ("cpu",
// "vulkan", "cuda"), and, for a backend other than the CPU, its device:
// the text between the first '/' and the last "/llama.cpp@" (a device
// description may itself hold a '/'), or everything after the first '/'
// when there is no "/llama.cpp@". An empty class (older nodes) gives
// "", "". The parts come from adverts: untrusted text, only ever shown.
func BackendOf(kernelClass string) (backend, device string) {
	i := strings.IndexByte(kernelClass, '/')
	if i < 0 {
		return kernelClass, ""
	}
	backend = kernelClass[:i]
	if backend == "cpu" {
		return backend, ""
	}
	rest := kernelClass[i+1:]
	if j := strings.LastIndex(kernelClass, "/llama.cpp@"); j >= i {
		rest = kernelClass[i+1 : max(i+1, j)]
	}
	return backend, rest
}
