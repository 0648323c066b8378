package check

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"time"
)

// Layout of the timeline, in CSS pixels.
const (
	htmlLabelW  = 150 // lane labels
	htmlChartW  = 1180
	htmlLaneH   = 16
	htmlBarH    = 11
	htmlHeadH   = 18 // a lock's header row
	htmlTopH    = 58 // fault labels and the axis
	htmlCharW   = 6.2
	htmlMaxList = 200 // violations listed under the picture
)

// Bar colours by how a lease ended.
var htmlOutcomes = []struct{ key, colour, label string }{
	{"released", "#43a047", "released (Unlock ok)"},
	{"lost", "#fb8c00", "lost (Done closed / Unlock: not held)"},
	{"unlockerr", "#8e24aa", "Unlock failed"},
	{"killed", "#616161", "worker killed or crashed"},
	{"open", "#64b5f6", "still held at the end"},
}

// Fault shading by fault kind.
var htmlFaultColour = map[string]string{
	FaultPauseHolder:   "#fdd835",
	FaultKillHolder:    "#e53935",
	FaultPartition:     "#8e24aa",
	FaultLatency:       "#00acc1",
	FaultRestartServer: "#3949ab",
	FaultRestartWiped:  "#d81b60",
	FaultPauseServer:   "#fb8c00",
	FaultKillLeader:    "#6d4c41",
	FaultClockJump:     "#00897b",
	FaultKillSession:   "#c0ca33",
}

type htmlLane struct {
	lock   string
	worker int
	gor    int
	y      float64 // top
}

// WriteHTML writes a self-contained HTML page (inline CSS and SVG, no
// network, no scripts) picturing the run: the verdict and the report's
// table at the top, then one lane per worker goroutine per lock with each
// grant as a bar from grant to its end, labelled with its token when it is
// wide enough and always with a tooltip, coloured by how it ended (released,
// lost, Unlock failed, killed, still held); the wait before it as a thin
// line; the holder's last validity deadline as a tick; writes the fence
// refused as dark red marks; fault windows shaded and labelled, their
// recovery (FaultRecovery) lighter; violations as red markers (amber when
// admitted by the docs) whose tooltip is the evidence; liveness stretches
// hatched on the lock's row; a time axis in seconds. r must be
// Analyze(h); a nil r is analysed here.
func WriteHTML(w io.Writer, h *History, r *Report) error {
	if h == nil {
		h = &History{}
	}
	if r == nil {
		r = Analyze(h)
	}
	a := &analysis{h: h, byLock: map[string][]*lease{}, deaths: map[int][]death{}, rep: &Report{}}
	a.index()
	bw := bufio.NewWriter(w)
	p := &htmlPage{w: bw, a: a, r: r}
	p.layout()
	p.write()
	return bw.Flush()
}

type htmlPage struct {
	w      *bufio.Writer
	a      *analysis
	r      *Report
	lanes  []htmlLane
	byKey  map[[3]string]*htmlLane
	heads  map[string]float64 // lock → header row top
	height float64
	start  int64
	span   int64
}

func esc(s string) string { return html.EscapeString(s) }

func (p *htmlPage) f(format string, args ...any) { fmt.Fprintf(p.w, format, args...) }

func (p *htmlPage) x(t int64) float64 {
	v := float64(htmlLabelW) + float64(t-p.start)/float64(p.span)*htmlChartW
	return math.Round(math.Min(math.Max(v, htmlLabelW), htmlLabelW+htmlChartW)*10) / 10
}

func (p *htmlPage) secs(t int64) string { return p.a.secs(t) }

func laneKey(lock string, w, g int) [3]string {
	return [3]string{lock, fmt.Sprint(w), fmt.Sprint(g)}
}

const htmlCSS = `body{font:13px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:16px;color:#212121;background:#fff}
h1{font-size:18px;margin:0 0 6px}
.verdict{display:inline-block;padding:6px 12px;border-radius:4px;font-weight:600;color:#fff;margin:4px 0 10px}
.pass{background:#2e7d32}.fail{background:#c62828}
table{border-collapse:collapse;margin:0 24px 10px 0;vertical-align:top;display:inline-table}
td,th{padding:2px 10px 2px 0;text-align:left}
td.n{text-align:right;font-variant-numeric:tabular-nums}
tr.bad td{color:#c62828;font-weight:600}tr.adm td{color:#ef6c00}
.legend span{display:inline-block;margin-right:14px}
.sw{display:inline-block;width:14px;height:10px;margin-right:4px;vertical-align:middle;border-radius:2px}
.chart{overflow-x:auto;border-top:1px solid #ddd;margin-top:8px}
svg text{font:10px system-ui,sans-serif}
svg .lbl{font-size:11px;fill:#424242}
svg .lock{font-size:11px;font-weight:600}
svg .tok{fill:#fff;font-size:9px}
svg .fl{font-size:10px;font-weight:600}
ol.v li{margin-bottom:3px}
ol.v .adm{color:#ef6c00}
code{font-size:12px}`

func (p *htmlPage) write() {
	r := p.r
	p.f("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>dlock check: %s</title>\n<style>%s</style></head><body>\n", esc(r.Backend), htmlCSS)
	p.f("<h1>dlock check: %s <code>%s</code></h1>\n", esc(r.Backend), esc(r.URL))
	cls := "pass"
	if r.Failed() {
		cls = "fail"
	}
	p.f("<div class=\"verdict %s\">%s</div>\n<div>", cls, esc(r.Verdict()))
	faults := "none"
	if len(r.FaultNames) > 0 {
		faults = strings.Join(r.FaultNames, ", ")
	}
	p.f("<table><tr><th colspan=2>run</th></tr>")
	for _, row := range [][2]string{
		{"workload", fmt.Sprintf("%d workers × %d goroutines × %d locks", r.Workers, r.Goroutines, r.Locks)},
		{"ttl / lock-delay", fmt.Sprintf("%s / %s", r.TTL, r.LockDelay)},
		{"duration", r.duration().Round(time.Millisecond).String()},
		{"faults", fmt.Sprintf("%s (%d injected)", faults, r.Faults)},
		{"grants", fmt.Sprint(r.Grants)},
		{"acquire errors", fmt.Sprint(r.AcquireErrors)},
		{"writes", fmt.Sprint(r.Writes)},
		{"fence rejected", fmt.Sprint(r.FenceRejected)},
		{"unfenced overlaps", fmt.Sprint(r.UnfencedOverlaps)},
	} {
		p.f("<tr><td>%s</td><td class=n>%s</td></tr>", esc(row[0]), esc(row[1]))
	}
	p.f("</table>\n<table><tr><th>violation class</th><th>count</th><th></th></tr>")
	for _, c := range r.Classes {
		row, status := "", "ok"
		switch {
		case c.Admitted:
			row, status = " class=adm", "admitted by the docs"
		case c.Count > 0:
			row, status = " class=bad", "VIOLATION"
		}
		title := ""
		if len(c.Evidence) > 0 {
			title = fmt.Sprintf(" title=\"%s\"", esc(strings.Join(c.Evidence, "\n")))
		}
		p.f("<tr%s%s><td>%s</td><td class=n>%d</td><td>%s</td></tr>", row, title, esc(c.Name), c.Count, status)
	}
	p.f("</table></div>\n<div class=legend>")
	for _, o := range htmlOutcomes {
		p.f("<span><i class=sw style=\"background:%s\"></i>%s</span>", o.colour, esc(o.label))
	}
	p.f("<span><i class=sw style=\"background:#bdbdbd;height:2px\"></i>waiting</span>")
	p.f("<span><i class=sw style=\"background:#000;width:2px\"></i>validity deadline read</span>")
	p.f("<span><i class=sw style=\"background:#b71c1c;width:3px\"></i>write refused by the fence</span>")
	p.f("<span><i class=sw style=\"background:#d32f2f;border-radius:7px;width:10px\"></i>violation</span>")
	p.f("<span><i class=sw style=\"background:#ffb300;border-radius:7px;width:10px\"></i>admitted violation</span>")
	p.f("<span><i class=sw style=\"background:#fdd835;opacity:.35\"></i>fault (lighter: recovery)</span></div>\n")
	p.svg()
	p.list()
	p.f("</body></html>\n")
}

func (p *htmlPage) list() {
	if len(p.r.Violations) == 0 {
		return
	}
	p.f("<h2 style=\"font-size:15px\">Violations</h2><ol class=v>")
	for i, v := range p.r.Violations {
		if i == htmlMaxList {
			p.f("</ol><p>… and %d more (see --json)</p>", len(p.r.Violations)-i)
			return
		}
		cls, note := "", ""
		if v.Admitted {
			cls, note = " class=adm", " — admitted by the docs ("+v.AdmittedBy+")"
		}
		p.f("<li%s><b>%s</b> at %s: %s%s</li>", cls, esc(v.Class), p.secs(v.At), esc(v.Evidence), esc(note))
	}
	p.f("</ol>")
}
