package main

import (
	"fmt"
	"html"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The plots are plain SVG written here: no plotting tool, no network.

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2"}

type series struct {
	name string
	xs   []float64
	ys   []float64
}

type plot struct {
	title, xLabel, yLabel string
	logX                  bool
	yMax                  float64 // fixed top of the y axis, 0 for the data's
	series                []series
}

const (
	plotW, plotH           = 760, 420
	padL, padR, padT, padB = 70, 270, 40, 50
	innerW, innerH         = plotW - padL - padR, plotH - padT - padB
	ticksX, ticksY         = 5, 5
)

func (p *plot) svg() string {
	var xmin, xmax, ymax = math.Inf(1), math.Inf(-1), 0.0
	for _, s := range p.series {
		for i, x := range s.xs {
			if p.logX {
				x = math.Log10(math.Max(x, 1))
			}
			xmin, xmax = math.Min(xmin, x), math.Max(xmax, x)
			ymax = math.Max(ymax, s.ys[i])
		}
	}
	if math.IsInf(xmin, 0) {
		xmin, xmax = 0, 1
	}
	if p.logX {
		xmin, xmax = math.Floor(xmin), math.Ceil(xmax)
	} else {
		xmin = 0
	}
	if xmax <= xmin {
		xmax = xmin + 1
	}
	if !p.logX {
		xmax = niceCeil(xmax)
	}
	ymax = niceCeil(ymax)
	if p.yMax > 0 {
		ymax = p.yMax
	}
	px := func(x float64) float64 {
		if p.logX {
			x = math.Log10(math.Max(x, 1))
		}
		return padL + (x-xmin)/(xmax-xmin)*innerW
	}
	py := func(y float64) float64 { return padT + innerH - y/ymax*innerH }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", plotW, plotH, plotW, plotH)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", plotW, plotH)
	fmt.Fprintf(&b, `<text x="%d" y="22" font-size="14" font-weight="bold">%s</text>`+"\n", padL, html.EscapeString(p.title))
	fmt.Fprintf(&b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", padL, padT, innerW, innerH)
	// Axes: ticks and grid.
	if p.logX {
		for e := xmin; e <= xmax; e++ {
			x := padL + (e-xmin)/(xmax-xmin)*innerW
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`+"\n", x, padT, x, padT+innerH)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, padT+innerH+16, tick(math.Pow(10, e)))
		}
	} else {
		for i := 0; i <= ticksX; i++ {
			v := xmin + (xmax-xmin)*float64(i)/ticksX
			x := px(v)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#eee"/>`+"\n", x, padT, x, padT+innerH)
			fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", x, padT+innerH+16, tick(v))
		}
	}
	for i := 0; i <= ticksY; i++ {
		v := ymax * float64(i) / ticksY
		y := py(v)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#eee"/>`+"\n", padL, y, padL+innerW, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", padL-6, y+4, tick(v))
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">%s</text>`+"\n", padL+innerW/2, plotH-10, html.EscapeString(p.xLabel))
	fmt.Fprintf(&b, `<text x="16" y="%d" text-anchor="middle" transform="rotate(-90 16 %d)">%s</text>`+"\n", padT+innerH/2, padT+innerH/2, html.EscapeString(p.yLabel))
	for k, s := range p.series {
		color := palette[k%len(palette)]
		var pts []string
		for i := range s.xs {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(s.xs[i]), py(s.ys[i])))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", color, strings.Join(pts, " "))
		if len(s.xs) <= 12 {
			for i := range s.xs {
				fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="3" fill="%s"/>`+"\n", px(s.xs[i]), py(s.ys[i]), color)
			}
		}
		ly := padT + 10 + 20*k
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="3"/>`+"\n", padL+innerW+12, ly, padL+innerW+32, ly, color)
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", padL+innerW+38, ly+4, html.EscapeString(s.name))
	}
	b.WriteString("</svg>\n")
	return b.String()
}

// niceCeil rounds v up to 1, 2, 2.5 or 5 times a power of ten (1 for v ≤ 0).
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

// tick formats an axis value briefly (1.5k, 20, 0.25).
func tick(v float64) string {
	switch {
	case v >= 1e6:
		return trim(fmt.Sprintf("%.1fM", v/1e6))
	case v >= 1e3:
		return trim(fmt.Sprintf("%.1fk", v/1e3))
	case v >= 10:
		return fmt.Sprintf("%.0f", v)
	default:
		return trim(fmt.Sprintf("%.2f", v))
	}
}

func trim(s string) string {
	unit := strings.TrimLeft(s, "0123456789.")
	num := strings.TrimSuffix(s, unit)
	if strings.Contains(num, ".") {
		num = strings.TrimRight(strings.TrimRight(num, "0"), ".")
	}
	return num + unit
}

// slug makes a file name part of a backend name.
func slug(s string) string {
	s = strings.ToLower(s)
	if i := strings.IndexAny(s, " ("); i > 0 {
		s = s[:i]
	}
	return s
}

// writePlots writes, per backend, handoff-<backend>.svg (the distribution
// of hand-off latency of each contender, as a CDF) and held-<backend>.svg
// (Lock+Unlock p50 against the number of leases held). It returns the
// files written, relative to dir.
func writePlots(dir string, results []*result) ([]string, error) {
	var files []string
	for _, res := range results {
		hp := &plot{title: res.backend + ": hand-off latency (8 goroutines, one lock)", xLabel: "release → next grant, µs (log)", yLabel: "share of hand-offs ≤ x, %", logX: true, yMax: 100}
		cp := &plot{title: res.backend + ": Lock+Unlock p50 with N other leases held", xLabel: "leases held by the client", yLabel: "p50 µs"}
		for _, r := range res.rows {
			if len(r.handoffs) > 1 {
				hp.series = append(hp.series, cdf(r.name, r.handoffs))
			}
			if len(r.held) > 1 {
				s := series{name: r.name}
				for _, l := range r.held {
					s.xs = append(s.xs, float64(l.Held))
					s.ys = append(s.ys, float64(l.Op.P50)/float64(time.Microsecond))
				}
				cp.series = append(cp.series, s)
			}
		}
		for _, p := range []struct {
			prefix string
			p      *plot
		}{{"handoff-", hp}, {"held-", cp}} {
			if len(p.p.series) == 0 {
				continue
			}
			name := p.prefix + slug(res.backend) + ".svg"
			if err := os.WriteFile(filepath.Join(dir, name), []byte(p.p.svg()), 0o644); err != nil {
				return files, err
			}
			files = append(files, name)
		}
	}
	return files, nil
}

// cdf is the empirical distribution of ds in at most 200 points.
func cdf(name string, ds []time.Duration) series {
	c := slices.Clone(ds)
	slices.Sort(c)
	s := series{name: name}
	step := max(1, len(c)/200)
	for i := 0; i < len(c); i += step {
		s.xs = append(s.xs, math.Max(float64(c[i])/float64(time.Microsecond), 1))
		s.ys = append(s.ys, 100*float64(i+1)/float64(len(c)))
	}
	s.xs = append(s.xs, math.Max(float64(c[len(c)-1])/float64(time.Microsecond), 1))
	s.ys = append(s.ys, 100)
	return s
}
