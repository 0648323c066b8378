package check

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"
)

func (p *htmlPage) layout() {
	p.start = p.a.start
	p.span = p.a.end - p.a.start
	if p.span <= 0 {
		p.span = int64(time.Second)
	}
	// locks: the history's order, then any others the events name
	locks := slices.Clone(p.a.h.Locks)
	seen := map[string]bool{}
	for _, l := range locks {
		seen[l] = true
	}
	var extra []string
	lanesOf := map[string]map[[2]int]bool{}
	for _, l := range p.a.leases {
		if l.lock == "" {
			continue
		}
		if !seen[l.lock] {
			seen[l.lock] = true
			extra = append(extra, l.lock)
		}
		if lanesOf[l.lock] == nil {
			lanesOf[l.lock] = map[[2]int]bool{}
		}
		lanesOf[l.lock][[2]int{l.ref.Worker, l.ref.Goroutine}] = true
	}
	sort.Strings(extra)
	locks = append(locks, extra...)
	p.byKey = map[[3]string]*htmlLane{}
	p.heads = map[string]float64{}
	y := float64(htmlTopH)
	// a row for events that belong to no lock (leaks, panics)
	p.heads[""] = y
	y += htmlHeadH
	for _, lock := range locks {
		p.heads[lock] = y
		y += htmlHeadH
		var ks [][2]int
		for k := range lanesOf[lock] {
			ks = append(ks, k)
		}
		slices.SortFunc(ks, func(a, b [2]int) int {
			if a[0] != b[0] {
				return a[0] - b[0]
			}
			return a[1] - b[1]
		})
		for _, k := range ks {
			p.lanes = append(p.lanes, htmlLane{lock: lock, worker: k[0], gor: k[1], y: y})
			y += htmlLaneH
		}
		y += 4
	}
	for i := range p.lanes {
		l := &p.lanes[i]
		p.byKey[laneKey(l.lock, l.worker, l.gor)] = l
	}
	p.height = y + 28
}

func (p *htmlPage) svg() {
	W := htmlLabelW + htmlChartW + 20
	p.f("<div class=chart><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%.0f\" viewBox=\"0 0 %d %.0f\">\n", W, p.height, W, p.height)
	p.f("<defs><pattern id=hatch width=6 height=6 patternUnits=userSpaceOnUse patternTransform=\"rotate(45)\"><rect width=3 height=6 fill=\"#e53935\" opacity=\".55\"/></pattern></defs>\n")
	// lane backgrounds
	for i, l := range p.lanes {
		if i%2 == 0 {
			p.f("<rect x=%d y=%.0f width=%d height=%d fill=\"#f5f5f5\"/>", htmlLabelW, l.y, htmlChartW, htmlLaneH)
		}
	}
	p.faults()
	p.axis()
	// headers and lane labels
	p.f("<text class=\"lock\" x=4 y=%.0f>events</text>\n", p.heads[""]+13)
	for lock, y := range p.heads {
		if lock == "" {
			continue
		}
		p.f("<text class=\"lock\" x=4 y=%.0f><title>%s</title>lock %s</text><line x1=%d x2=%d y1=%.0f y2=%.0f stroke=\"#9e9e9e\"/>\n",
			y+13, esc(lock), esc(truncate(lock, 18)), htmlLabelW, htmlLabelW+htmlChartW, y+htmlHeadH-1, y+htmlHeadH-1)
	}
	for _, l := range p.lanes {
		p.f("<text class=lbl x=14 y=%.0f>worker %d · g%d</text>\n", l.y+12, l.worker, l.gor)
	}
	p.leases()
	p.violations()
	p.f("</svg></div>\n")
}

// truncate shortens s to n runes, keeping its end (lock names generated for
// a run share their beginning).
func truncate(s string, n int) string {
	if r := []rune(s); len(r) > n {
		return "…" + string(r[len(r)-n+1:])
	}
	return s
}

func (p *htmlPage) faults() {
	rec := int64(FaultRecovery(p.a.h))
	top, bottom := float64(htmlTopH)-4, p.height-24
	if st := p.a.h.Stop; st > p.a.start && st < p.a.end {
		x := p.x(st)
		p.f("<g><title>workers stopping from %s (liveness not judged)</title><rect x=%.1f y=%.0f width=%.1f height=%.0f fill=\"#9e9e9e\" opacity=\".15\"/><text class=fl x=%.1f y=%.0f fill=\"#616161\">stopping</text></g>\n",
			p.secs(st), x, top, p.x(p.a.end)-x, bottom-top, x+2, top+10)
	}
	row := 0
	for _, w := range p.a.windows {
		c := htmlFaultColour[w.fault]
		if c == "" {
			c = "#757575"
		}
		x1, x2, x3 := p.x(w.start), p.x(w.end), p.x(w.end+rec)
		title := fmt.Sprintf("%s %s: %s – %s (recovery until %s)", w.fault, w.target, p.secs(w.start), p.secs(w.end), p.secs(w.end+rec))
		p.f("<g><title>%s</title><rect x=%.1f y=%.0f width=%.1f height=%.0f fill=\"%s\" opacity=\".30\"/>", esc(title), x1, top, math.Max(x2-x1, 1.5), bottom-top, c)
		p.f("<rect x=%.1f y=%.0f width=%.1f height=%.0f fill=\"%s\" opacity=\".09\"/>", x2, top, math.Max(x3-x2, 0), bottom-top, c)
		ly := 12 + float64(row%2)*13
		p.f("<rect x=%.1f y=%.0f width=8 height=8 fill=\"%s\"/><text class=fl x=%.1f y=%.0f fill=\"#424242\">%s %s</text></g>\n", x1, ly-8, c, x1+10, ly, esc(w.fault), esc(w.target))
		row++
	}
}

func (p *htmlPage) axis() {
	secs := float64(p.span) / 1e9
	step := 1.0
	for _, s := range []float64{0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600} {
		step = s
		if secs/s <= 20 {
			break
		}
	}
	yTop, yBot := float64(htmlTopH)-8, p.height-20
	for v := 0.0; v <= secs+1e-9; v += step {
		x := p.x(p.start + int64(v*1e9))
		label := strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".") + "s"
		p.f("<line x1=%.1f x2=%.1f y1=%.0f y2=%.0f stroke=\"#e0e0e0\"/><text x=%.1f y=%.0f text-anchor=middle fill=\"#757575\">%s</text><text x=%.1f y=%.0f text-anchor=middle fill=\"#757575\">%s</text>\n",
			x, x, yTop, yBot, x, yTop-2, label, x, yBot+12, label)
	}
}
