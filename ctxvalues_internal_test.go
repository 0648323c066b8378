package dlock

import (
	"context"
	"reflect"
	"testing"
	"time"
)

type (
	key1 struct{}
	key2 struct{}
)

// valuesOf peels the cancel and timer layers on top of a context, down to
// the first context with values of its own, and nothing below it: a value
// under a cancel layer under a value stays reachable.
func TestValuesOfPeelsCancelLayers(t *testing.T) {
	if len(peelable) != 3 {
		t.Fatalf("the layout check accepted %d layer types, want 3 (cancelCtx, timerCtx, withoutCancelCtx)", len(peelable))
	}
	inner, cancelInner := context.WithCancel(context.WithValue(context.Background(), key1{}, "v1"))
	defer cancelInner()
	v := context.WithValue(inner, key2{}, "v2")
	c1, cancel1 := context.WithTimeout(v, time.Minute)
	c2, cancel2 := context.WithCancelCause(context.WithoutCancel(c1))
	cancel2(nil)
	cancel1()
	if got := valuesOf(c2); got != v {
		t.Fatalf("valuesOf kept %v, want the value context under the cancel layers", got)
	}
	if got := valuesOf(v); got != v {
		t.Fatalf("valuesOf(a value context) = %v, want it unchanged", got)
	}
	for _, ctx := range []context.Context{context.Background(), context.TODO()} {
		tc, cancel := context.WithTimeout(ctx, time.Minute)
		cancel()
		if got := valuesOf(tc); got != nil {
			t.Fatalf("valuesOf(a timeout over %v) = %v, want nil", ctx, got)
		}
	}
	d := detachedValues(valuesOf(c2))
	if d.Value(key1{}) != "v1" || d.Value(key2{}) != "v2" || d.Done() != nil || d.Err() != nil {
		t.Fatalf("detached values: key1 %v, key2 %v, Done %v, Err %v", d.Value(key1{}), d.Value(key2{}), d.Done(), d.Err())
	}
	if _, ok := d.Deadline(); ok {
		t.Fatal("detached values carry a deadline")
	}
}

// goodLayer and misLaid are test layers for the layout check: goodLayer
// keeps its parent in its one context field; misLaid has one context field
// too, but its parent is elsewhere, as if a Go release had moved it.
type (
	goodLayer  struct{ context.Context }
	twoParents struct {
		context.Context
		other context.Context
	}
	misLaid struct {
		context.Context     // not the parent
		p               any // the parent
	}
)

func (m *misLaid) Value(k any) any { return m.p.(context.Context).Value(k) }

// The layout check keeps a layer only if reading its parent field gives the
// context it was built on; with none kept, valuesOf keeps contexts whole.
func TestPeelableFallsBackOnUnknownLayout(t *testing.T) {
	got := findPeelable(func(parent context.Context) []context.Context {
		return []context.Context{
			&misLaid{Context: context.TODO(), p: parent},
			&goodLayer{parent},
			goodLayer{parent}, // by value, as WithoutCancel's layer
			&twoParents{parent, parent},
		}
	})
	if len(got) != 2 || got[0].typ != reflect.TypeOf(&goodLayer{}) || got[1].typ != reflect.TypeOf(goodLayer{}) {
		var names []string
		for _, p := range got {
			names = append(names, p.typ.String())
		}
		t.Fatalf("the layout check accepted %v, want *goodLayer and goodLayer only", names)
	}

	saved := peelable
	defer func() { peelable = saved }()
	peelable = findPeelable(func(parent context.Context) []context.Context {
		return []context.Context{&misLaid{Context: context.TODO(), p: parent}}
	})
	v := context.WithValue(context.Background(), key1{}, "v1")
	c, cancel := context.WithTimeout(v, time.Minute)
	cancel()
	if got := valuesOf(c); got != c {
		t.Fatalf("with the layout check failed, valuesOf peeled %v to %v", c, got)
	}
	if got := detachedValues(valuesOf(c)).Value(key1{}); got != "v1" {
		t.Fatalf("with the layout check failed, the value is %v", got)
	}
}
