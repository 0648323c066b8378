package main

import (
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dlock/dlock/locktest"
)

// TestWritePlots: the plots are well-formed, self-contained SVG with one
// legend entry per contender that has data.
func TestWritePlots(t *testing.T) {
	dir := t.TempDir()
	res := &result{backend: "Redis", rows: []*row{
		{name: "floor", kind: kindFloor},
		{name: "dlock", kind: kindDlock, handoffs: []time.Duration{50 * time.Microsecond, 80 * time.Microsecond, 2 * time.Millisecond},
			held: []locktest.HeldLevel{{Held: 0, Op: locktest.Stats{N: 1, P50: 100 * time.Microsecond}}, {Held: 10000, Op: locktest.Stats{N: 1, P50: 120 * time.Microsecond}}}},
		{name: "peer <x>", kind: kindPeer, handoffs: []time.Duration{0, time.Microsecond}},
	}}
	files, err := writePlots(dir, []*result{res})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(files, " ") != "handoff-redis.svg held-redis.svg" {
		t.Fatalf("files %q", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		d := xml.NewDecoder(strings.NewReader(string(b)))
		for {
			if _, err := d.Token(); err != nil {
				if err.Error() != "EOF" {
					t.Fatalf("%s is not well-formed: %v", f, err)
				}
				break
			}
		}
		if strings.Contains(string(b), "href") || !strings.Contains(string(b), ">dlock<") {
			t.Errorf("%s: want a self-contained SVG with a dlock legend:\n%s", f, b)
		}
	}
}
