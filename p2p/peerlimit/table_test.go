package peerlimit

import (
	"fmt"
	"slices"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
)

func id(i int) peer.ID { return peer.ID(fmt.Sprint("peer-", i)) }

func keys[V any](t *Table[V]) []peer.ID {
	var out []peer.ID
	for p := range t.All() {
		out = append(out, p)
	}
	return out
}

// However many peers come, the table holds its bound: the most recent ones.
func TestTableBounded(t *testing.T) {
	for _, bound := range []int{1, 2, 7, 1000} {
		t.Run(fmt.Sprint(bound), func(t *testing.T) {
			tb := NewTable[int](bound)
			evictions := 0
			for i := range 10 * bound {
				if old, ok := tb.Put(id(i), i); ok {
					evictions++
					if want := id(i - bound); old != want {
						t.Fatalf("put %d evicted %s, want %s", i, old, want)
					}
				}
				if tb.Len() > bound {
					t.Fatalf("%d peers held, bound %d", tb.Len(), bound)
				}
			}
			if tb.Len() != bound || evictions != 9*bound {
				t.Fatalf("%d peers held after %d evictions, want %d and %d", tb.Len(), evictions, bound, 9*bound)
			}
			for i := range 10 * bound {
				v, ok := tb.Peek(id(i))
				if want := i >= 9*bound; ok != want || (ok && v != i) {
					t.Fatalf("peer %d: %d, %v; want held %v", i, v, ok, want)
				}
			}
		})
	}
}

// Which peer a full table forgets: the least recently put or got; peeking
// and iterating are not uses.
func TestTableEvictionOrder(t *testing.T) {
	a, b, c, d := peer.ID("a"), peer.ID("b"), peer.ID("c"), peer.ID("d")
	tests := []struct {
		name    string
		touch   func(*Table[int])
		evicted peer.ID
		order   []peer.ID // after the put of d
	}{
		{"untouched", func(*Table[int]) {}, a, []peer.ID{b, c, d}},
		{"get marks used", func(t *Table[int]) { t.Get(a) }, b, []peer.ID{c, a, d}},
		{"peek does not", func(t *Table[int]) { t.Peek(a) }, a, []peer.ID{b, c, d}},
		{"all does not", func(t *Table[int]) {
			for range t.All() {
			}
		}, a, []peer.ID{b, c, d}},
		{"put again marks used", func(t *Table[int]) { t.Put(a, 10) }, b, []peer.ID{c, a, d}},
		{"get of a missing peer", func(t *Table[int]) { t.Get(d) }, a, []peer.ID{b, c, d}},
		{"delete makes room", func(t *Table[int]) { t.Delete(b) }, "", []peer.ID{a, c, d}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tb := NewTable[int](3)
			tb.Put(a, 1)
			tb.Put(b, 2)
			tb.Put(c, 3)
			tt.touch(tb)
			old, ok := tb.Put(d, 4)
			if ok != (tt.evicted != "") || old != tt.evicted {
				t.Fatalf("evicted %q (%v), want %q", old, ok, tt.evicted)
			}
			if got := keys(tb); !slices.Equal(got, tt.order) {
				t.Fatalf("order %v, want %v", got, tt.order)
			}
		})
	}
}

func TestTableDelete(t *testing.T) {
	tb := NewTable[int](10)
	for i := range 10 {
		tb.Put(id(i), i)
	}
	tb.DeleteFunc(func(_ peer.ID, v int) bool { return v%2 == 0 })
	for p, v := range tb.All() {
		if v%3 == 0 {
			tb.Delete(p) // the peer being yielded may go
		}
	}
	tb.Delete("absent")
	if got, want := keys(tb), []peer.ID{id(1), id(5), id(7)}; !slices.Equal(got, want) {
		t.Fatalf("left %v, want %v", got, want)
	}
	for p := range tb.All() {
		if p == id(5) {
			break
		}
	}
	if v, ok := tb.Get(id(7)); !ok || v != 7 {
		t.Fatalf("get 7: %d, %v", v, ok)
	}
}

func TestNewTableRejectsNoBound(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("NewTable(0) did not panic")
		}
	}()
	NewTable[int](0)
}

// FuzzTable checks the table against a slice kept in use order (the
// obvious, linear LRU) over any sequence of operations.
func FuzzTable(f *testing.F) {
	f.Add(uint8(3), []byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add(uint8(1), []byte{0x10, 0x21, 0x32, 0x43, 0x11, 0x50})
	f.Add(uint8(4), []byte{1, 2, 3, 4, 0x41, 0x22, 5, 6, 0x63, 0x30, 7, 8})
	f.Fuzz(func(t *testing.T, bound uint8, ops []byte) {
		n := int(bound%8) + 1
		tb := NewTable[int](n)
		var model []peer.ID // least recently used first
		vals := map[peer.ID]int{}
		touch := func(p peer.ID) {
			model = slices.DeleteFunc(model, func(q peer.ID) bool { return q == p })
			model = append(model, p)
		}
		for i, op := range ops {
			p := id(int(op & 0x0f))
			_, held := vals[p]
			switch op >> 4 % 4 {
			case 0: // put
				old, ok := tb.Put(p, i)
				wantEvict := !held && len(model) == n
				if ok != wantEvict || (ok && old != model[0]) {
					t.Fatalf("op %d: put evicted %q %v, model %v", i, old, ok, model)
				}
				if wantEvict {
					delete(vals, model[0])
					model = model[1:]
				}
				vals[p] = i
				touch(p)
			case 1: // get
				v, ok := tb.Get(p)
				if ok != held || (ok && v != vals[p]) {
					t.Fatalf("op %d: get %d %v, want %d %v", i, v, ok, vals[p], held)
				}
				if held {
					touch(p)
				}
			case 2: // peek
				if v, ok := tb.Peek(p); ok != held || (ok && v != vals[p]) {
					t.Fatalf("op %d: peek %d %v, want %d %v", i, v, ok, vals[p], held)
				}
			case 3: // delete
				tb.Delete(p)
				delete(vals, p)
				model = slices.DeleteFunc(model, func(q peer.ID) bool { return q == p })
			}
			if got := keys(tb); !slices.Equal(got, model) || tb.Len() != len(model) {
				t.Fatalf("op %d: table %v (len %d), model %v", i, got, tb.Len(), model)
			}
		}
	})
}
