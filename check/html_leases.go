package check

import (
	"fmt"
	"math"
	"strings"
)

func (l *lease) outcome() string {
	switch {
	case l.unlockEnd != none && l.unlockErr == "" && (l.done == none || l.done >= l.unlockStart):
		return "released"
	case l.done != none && l.doneErr != "" && (l.unlockStart == none || l.done < l.unlockStart):
		return "lost"
	case l.unlockEnd != none && strings.Contains(strings.ToLower(l.unlockErr), "not held"):
		return "lost"
	case l.unlockEnd != none:
		return "unlockerr"
	case l.died != none:
		return "killed"
	case l.done != none:
		return "lost"
	}
	return "open"
}

func outcomeColour(o string) string {
	for _, x := range htmlOutcomes {
		if x.key == o {
			return x.colour
		}
	}
	return "#9e9e9e"
}

func (p *htmlPage) leases() {
	for _, l := range p.a.leases {
		ln := p.byKey[laneKey(l.lock, l.ref.Worker, l.ref.Goroutine)]
		if ln == nil {
			continue
		}
		mid := ln.y + htmlLaneH/2
		if l.request != none {
			to := p.a.end
			for _, t := range []int64{l.grant, l.acquireErr, l.died} {
				if t != none && t < to {
					to = t
				}
			}
			p.f("<line x1=%.1f x2=%.1f y1=%.1f y2=%.1f stroke=\"#bdbdbd\" stroke-width=2><title>%s waiting %s – %s</title></line>",
				p.x(l.request), p.x(to), mid, mid, esc(l.ref.String()), p.secs(l.request), p.secs(to))
			if l.acquireErr != none && !l.granted() {
				x := p.x(l.acquireErr)
				p.f("<path d=\"M%.1f %.1fl4 4m0 -4l-4 4\" stroke=\"#757575\"><title>%s: Lock failed at %s</title></path>", x-2, mid-2, esc(l.ref.String()), p.secs(l.acquireErr))
			}
		}
		if !l.granted() {
			continue
		}
		end := l.heldEnd(p.a.end)
		if l.unlockEnd == none && l.done == none && l.died == none && l.lastWrite != none {
			end = max(l.lastWrite, end)
		}
		o := l.outcome()
		x1, x2 := p.x(l.grant), p.x(end)
		wd := math.Max(x2-x1, 1)
		var tip strings.Builder
		fmt.Fprintf(&tip, "%s token %d\ngranted %s", l.ref, l.ref.Token, p.secs(l.grant))
		if l.validUntil != 0 {
			fmt.Fprintf(&tip, ", valid until %s (last read)", p.secs(l.validUntil))
		}
		if l.done != none {
			fmt.Fprintf(&tip, "\nDone %s %s", p.secs(l.done), l.doneErr)
		}
		if l.unlockStart != none {
			fmt.Fprintf(&tip, "\nUnlock %s", p.secs(l.unlockStart))
			if l.unlockEnd != none {
				res := "ok"
				if l.unlockErr != "" {
					res = l.unlockErr
				}
				fmt.Fprintf(&tip, " – %s: %s", p.secs(l.unlockEnd), res)
			}
		}
		if l.died != none {
			fmt.Fprintf(&tip, "\nworker died %s", p.secs(l.died))
		}
		p.f("<g><title>%s</title><rect x=%.1f y=%.1f width=%.1f height=%d rx=1.5 fill=\"%s\"/>", esc(tip.String()), x1, ln.y+2, wd, htmlBarH, outcomeColour(o))
		label := fmt.Sprint(l.ref.Token)
		if wd >= float64(len(label))*htmlCharW+4 {
			p.f("<text class=tok x=%.1f y=%.1f>%s</text>", x1+2, ln.y+11, label)
		}
		p.f("</g>")
		// the deadline matters when the hold did not end cleanly before it
		if l.validUntil != 0 && l.validUntil > l.grant && (o != "released" || l.unlockStart > l.validUntil) {
			vx := p.x(l.validUntil)
			p.f("<line x1=%.1f x2=%.1f y1=%.1f y2=%.1f stroke=\"#000\" stroke-width=1.5><title>%s: valid until %s (last reading)</title></line>",
				vx, vx, ln.y+1, ln.y+htmlLaneH-1, esc(l.ref.String()), p.secs(l.validUntil))
		}
		p.f("\n")
	}
	// writes the fence refused
	for _, e := range p.a.events {
		if e.Kind != KindWrite || e.Accepted {
			continue
		}
		ln := p.byKey[laneKey(e.Lock, e.Worker, e.Goroutine)]
		if ln == nil {
			continue
		}
		p.f("<rect x=%.1f y=%.1f width=2 height=5 fill=\"#b71c1c\"><title>w%d/g%d write with token %d at %s refused by the fence</title></rect>\n",
			p.x(e.Mono)-1, ln.y+htmlLaneH-5, e.Worker, e.Goroutine, e.Token, p.secs(e.Mono))
	}
}
