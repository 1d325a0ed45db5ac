package placement

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// Extras.Plan: which models a multi-model node serves whole beside its own.
func TestExtrasPlan(t *testing.T) {
	const idle = 30 * time.Minute
	need := map[string]int64{"own": 10, "b": 8, "c": 30, "e": 5}
	none := func(string) bool { return false }
	for _, tc := range []struct {
		name        string
		whole       bool
		spare       int64
		loads       []ModelLoad
		extras      map[string]bool
		skip        func(string) bool
		wantLoad    string
		wantRelease []string
	}{
		{"asked for, no route, fits: load it", true, 10, []ModelLoad{{Fingerprint: "b", Demand: 1, Unmet: 1}}, nil, none, "b", nil},
		{"does not fit", true, 7, []ModelLoad{{Fingerprint: "b", Demand: 1, Unmet: 1}}, nil, none, "", nil},
		{"own window not whole: no extras", false, 100, []ModelLoad{{Fingerprint: "b", Demand: 1, Unmet: 1}}, nil, none, "", nil},
		{"someone is loading it (planned)", true, 10, []ModelLoad{{Fingerprint: "b", Demand: 1, Unmet: 1, Nodes: 1}}, nil, none, "", nil},
		{"routes already: extras only warm (more routes come from switches)", true, 10, []ModelLoad{{Fingerprint: "b", Demand: 4, Unmet: 1, Nodes: 1, Routes: 1}}, nil, none, "", nil},
		{"routes and only refusals: nothing (a liar's report)", true, 10, []ModelLoad{{Fingerprint: "b", Demand: 50, Unmet: 50, Nodes: 1, Routes: 1}}, nil, none, "", nil},
		{"not asked for", true, 10, []ModelLoad{{Fingerprint: "b", Nodes: 0}}, nil, none, "", nil},
		{"failed lately", true, 10, []ModelLoad{{Fingerprint: "b", Demand: 1, Unmet: 1}}, nil, func(fp string) bool { return fp == "b" }, "", nil},
		{"the hungriest that fits", true, 10, []ModelLoad{{Fingerprint: "b", Demand: 1, Unmet: 1}, {Fingerprint: "e", Demand: 3, Unmet: 3}, {Fingerprint: "c", Demand: 9, Unmet: 9}}, nil, none, "e", nil},
		{"an idle extra is released, its memory reused", true, 4, []ModelLoad{{Fingerprint: "e", IdleFor: idle}, {Fingerprint: "b", Demand: 1, Unmet: 1}}, map[string]bool{"e": true}, none, "b", []string{"e"}},
		{"an extra idle less than the release time stays", true, 4, []ModelLoad{{Fingerprint: "e", IdleFor: idle - time.Minute}, {Fingerprint: "b", Demand: 1, Unmet: 1}}, map[string]bool{"e": true}, none, "", nil},
		{"an extra still asked for stays", true, 0, []ModelLoad{{Fingerprint: "e", Demand: 1, IdleFor: 0}}, map[string]bool{"e": true}, none, "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The budget leaves tc.spare beside the own model and the extras.
			budget := need["own"] + tc.spare
			for fp := range tc.extras {
				budget += need[fp]
			}
			e := Extras{Own: "own", OwnWhole: tc.whole, Budget: budget, Need: need, Served: tc.extras, Skip: tc.skip, IdleRelease: idle}
			if got := e.Spare(); got != tc.spare {
				t.Fatalf("Spare() = %d, want %d", got, tc.spare)
			}
			load, release := e.Plan(tc.loads)
			if load != tc.wantLoad || !slices.Equal(release, tc.wantRelease) {
				t.Fatalf("load %q release %v, want %q %v", load, release, tc.wantLoad, tc.wantRelease)
			}
		})
	}
}

// Extras.RoomFor: which extras a switch releases first, and when it
// must not.
func TestExtrasRoomFor(t *testing.T) {
	const idle = 30 * time.Minute
	need := map[string]int64{"own": 10, "new": 20, "a": 5, "b": 5, "c": 5}
	for _, tc := range []struct {
		name   string
		budget int64
		served []string
		loads  []ModelLoad
		want   []string
		noRoom bool
	}{
		{"no extras: nothing to release", 25, nil, nil, nil, false},
		{"fits beside the extras", 30, []string{"a", "b"}, nil, nil, false},
		{"the longest idle goes first, only as many as needed", 30, []string{"a", "b", "c"},
			[]ModelLoad{{Fingerprint: "a", IdleFor: idle}, {Fingerprint: "b", IdleFor: 2 * idle}, {Fingerprint: "c", IdleFor: idle + time.Minute}}, []string{"b"}, false},
		{"two released", 25, []string{"a", "b", "c"},
			[]ModelLoad{{Fingerprint: "a", IdleFor: idle}, {Fingerprint: "b", IdleFor: 2 * idle}, {Fingerprint: "c", IdleFor: idle + time.Minute}}, []string{"b", "c"}, false},
		{"the last route of a model asked for: refused", 24, []string{"a"},
			[]ModelLoad{{Fingerprint: "a", Demand: 1, Routes: 1}}, nil, true},
		{"asked for lately, one route: refused", 24, []string{"a"},
			[]ModelLoad{{Fingerprint: "a", IdleFor: idle - time.Minute, Routes: 1}}, nil, true},
		{"asked for, but other routes exist: released", 24, []string{"a"},
			[]ModelLoad{{Fingerprint: "a", Demand: 1, Routes: 2}}, []string{"a"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			served := map[string]bool{}
			for _, fp := range tc.served {
				served[fp] = true
			}
			e := Extras{Own: "own", OwnWhole: true, Budget: tc.budget, Need: need, Served: served, IdleRelease: idle}
			got, err := e.RoomFor("new", tc.loads)
			if tc.noRoom != errors.Is(err, ErrNoRoom) || (!tc.noRoom && err != nil) {
				t.Fatalf("err = %v, want ErrNoRoom %v", err, tc.noRoom)
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("release %v, want %v", got, tc.want)
			}
		})
	}
}
