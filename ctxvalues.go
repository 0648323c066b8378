package dlock

import (
	"context"
	"reflect"
	"time"
	"unsafe"
)

// A Lease keeps the context Lock was called with only for the values of
// Lease.Context. Most callers give Lock a context of its own, made by
// context.WithTimeout or WithCancel and cancelled as soon as Lock returns;
// kept whole, that timer or cancel context, its closed Done channel and its
// error stay alive as long as the lease (≈220 B), though they answer Value
// for every key of the caller's by asking their parent. valuesOf peels such
// layers off the top of the chain, keeping the first context that has values
// of its own, so a lease keeps exactly what Context needs.
//
// The context package does not export a context's parent, so valuesOf reads
// it from the layer's memory at the offset of its parent field, which
// peelable finds, by reflection, on layers built for the purpose when the
// package is initialised, and keeps only if reading there gives back the
// parent each was built on. If a Go release lays the types out differently,
// the check fails and valuesOf keeps the context whole, as it did before:
// the layers cost memory again, but nothing answers differently.

// peelLayer is one kind of value-less layer valuesOf may peel: contexts of
// the dynamic type typ keep their parent at off in the memory their
// interface's data word points to.
type peelLayer struct {
	typ reflect.Type
	off uintptr
}

// peelable lists the layers valuesOf peels (empty if the layout check
// failed for all of them).
var peelable = findPeelable(probeLayers)

// probeLayers builds each kind of layer valuesOf may peel on parent:
// WithCancel's and WithCancelCause's cancelCtx, WithTimeout's and
// WithDeadline's timerCtx, and WithoutCancel's layer. All of them answer
// Value for any key of the caller's by asking their parent; only a key
// private to package context differs, and Lease.Context hides the
// cancellation that key is about behind context.WithoutCancel anyway.
func probeLayers(parent context.Context) []context.Context {
	c, cancel := context.WithCancel(parent)
	cancel()
	t, cancel := context.WithTimeout(parent, time.Hour)
	cancel()
	return []context.Context{c, t, context.WithoutCancel(parent)}
}

// probeKey is the key of the value under the probe layers.
type probeKey struct{}

// findPeelable returns the layers build makes whose layout passes the
// check, one entry per distinct type.
func findPeelable(build func(context.Context) []context.Context) []peelLayer {
	parent := context.WithValue(context.Background(), probeKey{}, "probe")
	var found []peelLayer
	for _, layer := range build(parent) {
		t := reflect.TypeOf(layer)
		off, ok := parentOffset(t)
		if !ok || containsType(found, t) {
			continue
		}
		p := peelLayer{typ: t, off: off}
		got := p.parent(layer)
		if reflect.TypeOf(got) != reflect.TypeOf(parent) || got != parent || got.Value(probeKey{}) != "probe" {
			continue
		}
		found = append(found, p)
	}
	return found
}

func containsType(ls []peelLayer, t reflect.Type) bool {
	for _, l := range ls {
		if l.typ == t {
			return true
		}
	}
	return false
}

// ctxType is the interface type a layer's parent field has.
var ctxType = reflect.TypeFor[context.Context]()

// parentOffset finds the field of type context.Context in the struct a
// context of type t keeps behind its interface's data word: t a pointer to
// a struct, or a struct of more than one word (not stored in the word
// itself), searched through embedded structs. It reports false if there is
// no such field, or more than one.
func parentOffset(t reflect.Type) (uintptr, bool) {
	switch {
	case t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct:
		t = t.Elem()
	case t.Kind() == reflect.Struct && t.Size() > unsafe.Sizeof(uintptr(0)):
	default:
		return 0, false
	}
	offs := ctxFields(t, 0, nil)
	if len(offs) != 1 {
		return 0, false
	}
	return offs[0], true
}

// ctxFields appends the offsets of the fields of type context.Context in
// struct t (at base), and of those of the structs it holds by value.
func ctxFields(t reflect.Type, base uintptr, offs []uintptr) []uintptr {
	for i := range t.NumField() {
		f := t.Field(i)
		switch {
		case f.Type == ctxType:
			offs = append(offs, base+f.Offset)
		case f.Type.Kind() == reflect.Struct:
			offs = ctxFields(f.Type, base+f.Offset, offs)
		}
	}
	return offs
}

// parent reads the parent of ctx, a context of type p.typ.
func (p peelLayer) parent(ctx context.Context) context.Context {
	data := (*[2]unsafe.Pointer)(unsafe.Pointer(&ctx))[1]
	return *(*context.Context)(unsafe.Add(data, p.off))
}

// valuesOf returns a context that answers Value for every key as ctx does
// and keeps no value-less cancellation layer of ctx's alive (see peelable);
// nil when that context is context.Background or TODO, which hold nothing.
func valuesOf(ctx context.Context) context.Context {
peel:
	for {
		t := reflect.TypeOf(ctx)
		for _, p := range peelable {
			if p.typ == t {
				ctx = p.parent(ctx)
				continue peel
			}
		}
		break
	}
	if t := reflect.TypeOf(ctx); t == backgroundType || t == todoType {
		return nil
	}
	return ctx
}

// The types of context.Background and context.TODO: every value of each is
// the same empty context.
var (
	backgroundType = reflect.TypeOf(context.Background())
	todoType       = reflect.TypeOf(context.TODO())
)

// detachedValues is the context Lease.Context and MultiLease.Context derive
// from: the values of v (a valuesOf result), no cancellation, no deadline.
func detachedValues(v context.Context) context.Context {
	if v == nil {
		return context.Background()
	}
	return context.WithoutCancel(v)
}
