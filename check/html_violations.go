package check

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// htmlMarker is one violation triangle; violations that fall on the same
// few pixels of one lane share a marker, whose tooltip counts them.
type htmlMarker struct {
	x, y   float64
	colour string
	small  bool
	tips   []string
	hidden int
}

func (p *htmlPage) violations() {
	var markers []*htmlMarker
	at := map[[3]int]*htmlMarker{}
	for i, v := range p.r.Violations {
		colour := "#d32f2f"
		if v.Admitted {
			colour = "#ffb300"
		}
		tip := fmt.Sprintf("#%d %s", i+1, v.Class)
		if v.Admitted {
			tip += " (admitted by the docs: " + v.AdmittedBy + ")"
		}
		tip += "\n" + v.Evidence
		if v.Class == ClassLiveness {
			y := p.heads[v.Lock]
			p.f("<rect x=%.1f y=%.0f width=%.1f height=%d fill=\"url(#hatch)\" stroke=\"%s\"><title>%s</title></rect>\n",
				p.x(v.From), y+3, math.Max(p.x(v.At)-p.x(v.From), 2), htmlHeadH-6, colour, esc(tip))
			continue
		}
		var ys []float64
		for _, o := range v.Ops {
			if ln := p.byKey[laneKey(v.Lock, o.Worker, o.Goroutine)]; ln != nil {
				ys = append(ys, ln.y+htmlLaneH/2)
			}
		}
		if len(ys) == 0 {
			ys = []float64{p.heads[v.Lock] + htmlHeadH/2}
		}
		x := p.x(v.At)
		// a violation the docs do not admit gets a line joining the
		// lanes involved; admitted ones (often hundreds after a wiped
		// restart) only a small marker
		if lo, hi := slices.Min(ys), slices.Max(ys); hi > lo && !v.Admitted {
			p.f("<line x1=%.1f x2=%.1f y1=%.1f y2=%.1f stroke=\"%s\" stroke-width=1.5 stroke-dasharray=\"3 2\"><title>%s</title></line>\n", x, x, lo, hi, colour, esc(tip))
		}
		y := ys[len(ys)-1]
		adm := 0
		if v.Admitted {
			adm = 1
		}
		k := [3]int{int(y), int(x / 5), adm}
		m := at[k]
		if m == nil {
			m = &htmlMarker{x: x, y: y, colour: colour, small: v.Admitted}
			at[k] = m
			markers = append(markers, m)
		}
		if len(m.tips) < 5 {
			m.tips = append(m.tips, tip)
		} else {
			m.hidden++
		}
	}
	for _, m := range markers {
		tip := strings.Join(m.tips, "\n\n")
		if m.hidden > 0 {
			tip += fmt.Sprintf("\n\n… and %d more here", m.hidden)
		}
		w, hgt := 5.0, 8.0
		if m.small {
			w, hgt = 3.5, 6
		}
		p.f("<path d=\"M%.1f %.1fl%.1f -%.1fh-%.1fz\" fill=\"%s\" stroke=\"#fff\" stroke-width=.6><title>%s</title></path>\n",
			m.x, m.y+1, w, hgt, 2*w, m.colour, esc(tip))
	}
}
