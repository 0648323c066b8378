package main

import (
	"fmt"
	"io"
	"strings"
	"time"
)

func us(d time.Duration) string {
	if d <= 0 {
		return "–"
	}
	v := float64(d) / float64(time.Microsecond)
	switch {
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func ratio(a, b time.Duration) string {
	if a <= 0 || b <= 0 {
		return "–"
	}
	return fmt.Sprintf("%.2f×", float64(a)/float64(b))
}

// floorOf is the lowest uncontended p50 of the backend's floors.
func (res *result) floorOf() time.Duration {
	var best time.Duration
	for _, r := range res.rows {
		if r.kind == kindFloor && r.unc.P50 > 0 && (best == 0 || r.unc.P50 < best) {
			best = r.unc.P50
		}
	}
	return best
}

// bestPeer returns the lowest value of f over the peers (0 for none).
func (res *result) bestPeer(f func(*row) time.Duration) time.Duration {
	var best time.Duration
	for _, r := range res.rows {
		if v := f(r); r.kind == kindPeer && v > 0 && (best == 0 || v < best) {
			best = v
		}
	}
	return best
}

// writeMarkdown writes the results as markdown tables, one section per
// backend.
func writeMarkdown(w io.Writer, header string, results []*result, cfg *config) error {
	var b strings.Builder
	b.WriteString(header)
	b.WriteString("\n" + summary(results))
	for _, res := range results {
		fmt.Fprintf(&b, "\n### %s\n\n", res.backend)
		floor := res.floorOf()
		uncPeer := res.bestPeer(func(r *row) time.Duration { return r.unc.P50 })
		b.WriteString("| contender | Lock+Unlock p50 µs | p99 µs | × floor | × best peer | hand-off p50 µs | p99 µs | ops/s | re-take | wake p50 µs | B/lease | held " +
			fmt.Sprint(lastLevel(cfg)) + " ÷ 0 |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
		for _, r := range res.rows {
			row := []string{r.name, us(r.unc.P50), us(r.unc.P99), ratio(r.unc.P50, floor), "–", "–", "–", "–", "–", "–", "–", "–"}
			if r.kind != kindPeer {
				row[4] = ratio(r.unc.P50, uncPeer)
			}
			if r.kind != kindFloor {
				if r.hotOps > 0 {
					row[5], row[6] = us(r.handoff.P50), us(r.handoff.P99)
					row[7] = fmt.Sprintf("%.0f", r.opsPerSec())
					row[8] = fmt.Sprintf("%.0f%%", 100*r.retakeShare())
				}
				if r.wake.N > 0 {
					row[9] = us(r.wake.P50)
				}
				if r.heldDone && len(r.held) > 1 {
					row[10] = fmt.Sprintf("%.0f", r.bytesPerLease)
					first, last := r.held[0].Op.P50, r.held[len(r.held)-1].Op.P50
					row[11] = ratio(last, first)
				}
			}
			b.WriteString("| " + strings.Join(row, " | ") + " |\n")
		}
		var notes []string
		for _, r := range res.rows {
			for _, e := range r.errs {
				notes = append(notes, fmt.Sprintf("- %s: %s", r.name, oneLine(e)))
			}
		}
		if held := heldTable(res); held != "" {
			b.WriteString("\n" + held)
		}
		if len(notes) > 0 {
			b.WriteString("\nErrors:\n" + strings.Join(notes, "\n") + "\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// heldTable is the Lock+Unlock p50 per level of the many-held scenario.
func heldTable(res *result) string {
	var levels []int
	for _, r := range res.rows {
		if len(r.held) > len(levels) {
			levels = levels[:0]
			for _, l := range r.held {
				levels = append(levels, l.Held)
			}
		}
	}
	if len(levels) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("| Lock+Unlock p50 µs with N held | acquire µs/lease |")
	for _, l := range levels {
		fmt.Fprintf(&b, " N=%d |", l)
	}
	b.WriteString("\n|---|---|" + strings.Repeat("---|", len(levels)) + "\n")
	for _, r := range res.rows {
		if len(r.held) == 0 {
			continue
		}
		fmt.Fprintf(&b, "| %s | %s |", r.name, us(r.acquirePer))
		for i := range levels {
			v := "–"
			if i < len(r.held) {
				v = us(r.held[i].Op.P50)
			}
			b.WriteString(" " + v + " |")
		}
		b.WriteString("\n")
	}
	return b.String()
}

func lastLevel(cfg *config) int {
	if len(cfg.held) == 0 {
		return 0
	}
	return cfg.held[len(cfg.held)-1]
}

func oneLine(s string) string {
	s = strings.ReplaceAll(s, "\n", " ")
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// summary is one line per backend: the floor, each dlock contender and the
// best peer on uncontended Lock+Unlock (p50), dlock's ratio to the best peer,
// and the wake-up p50 of dlock and of the best peer there.
func summary(results []*result) string {
	var b strings.Builder
	b.WriteString("| backend | raw floor | dlock | best peer | dlock ÷ best peer | wake p50: dlock / best peer | held " +
		"N ÷ 0: dlock / best peer | B/lease: dlock / best peer | acquire µs/lease: dlock / best peer |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, res := range results {
		var dl []string
		var best *row
		for _, r := range res.rows {
			if r.kind == kindPeer && r.unc.P50 > 0 && (best == nil || r.unc.P50 < best.unc.P50) {
				best = r
			}
		}
		var ratios, wakes, held, bytes, acq []string
		peerWake := res.bestPeer(func(r *row) time.Duration { return r.wake.P50 })
		for _, r := range res.rows {
			if r.kind != kindDlock {
				continue
			}
			label := strings.TrimSpace(strings.TrimPrefix(r.name, "dlock"))
			pre := ""
			if label != "" {
				pre = label + " "
			}
			dl = append(dl, pre+us(r.unc.P50))
			if best != nil {
				ratios = append(ratios, pre+ratio(r.unc.P50, best.unc.P50))
			}
			wakes = append(wakes, pre+us(r.wake.P50))
			if r.heldDone && len(r.held) > 1 {
				held = append(held, pre+ratio(r.held[len(r.held)-1].Op.P50, r.held[0].Op.P50))
				bytes = append(bytes, fmt.Sprintf("%s%.0f", pre, r.bytesPerLease))
				acq = append(acq, pre+us(r.acquirePer))
			}
		}
		peer, peerHeld, peerBytes := "–", "–", "–"
		if best != nil {
			peer = best.name + " " + us(best.unc.P50)
		}
		// The peers' many-held figures: the lowest of each.
		var ph, pb float64
		var pa time.Duration
		for _, r := range res.rows {
			if r.kind != kindPeer || !r.heldDone || len(r.held) < 2 || r.held[0].Op.P50 <= 0 {
				continue
			}
			x := float64(r.held[len(r.held)-1].Op.P50) / float64(r.held[0].Op.P50)
			if ph == 0 || x < ph {
				ph = x
			}
			if pb == 0 || r.bytesPerLease < pb {
				pb = r.bytesPerLease
			}
			if pa == 0 || r.acquirePer < pa {
				pa = r.acquirePer
			}
		}
		if ph > 0 {
			peerHeld = fmt.Sprintf("%.2f×", ph)
			peerBytes = fmt.Sprintf("%.0f", pb)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s / %s | %s / %s | %s / %s | %s / %s |\n", res.backend, us(res.floorOf()),
			strings.Join(dl, ", "), peer, orDash(strings.Join(ratios, ", ")), strings.Join(wakes, ", "), us(peerWake),
			orDash(strings.Join(held, ", ")), peerHeld, orDash(strings.Join(bytes, ", ")), peerBytes,
			orDash(strings.Join(acq, ", ")), us(pa))
	}
	return b.String()
}

func orDash(s string) string {
	if s == "" {
		return "–"
	}
	return s
}
