package main

import (
	"fmt"
	"html"
	"strings"
)

// chart draws the ratios that have a target as horizontal bars, with the
// target marked: a small hand-written SVG, rather than a plotting
// library and its dependencies for one chart.
func (r *runner) chart() string {
	type bar struct {
		label, target string
		ratio, goal   float64
		met           bool
	}
	var bars []bar
	for _, res := range r.results {
		if res.Met == nil || res.Ratio == 0 || res.Goal == 0 {
			continue // no target, or a target on a figure, not a ratio
		}
		bars = append(bars, bar{label: res.Bus + ": " + res.Case, target: res.Target, ratio: res.Ratio, goal: res.Goal, met: *res.Met})
	}
	const rowH, left, width = 34, 330, 420
	scale := 0.0
	for _, b := range bars {
		scale = max(scale, b.ratio, b.goal)
	}
	scale *= 1.1
	h := rowH*len(bars) + 60
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">`+"\n", left+width+140, h)
	fmt.Fprintf(&sb, `<text x="10" y="20" font-size="14" font-weight="bold">a2a-bus: ratios against their baselines (bar), targets (line)</text>`+"\n")
	for i, b := range bars {
		y := 40 + i*rowH
		w := b.ratio / scale * width
		colour := "#2e7d32"
		if !b.met {
			colour = "#c62828"
		}
		gx := float64(left) + b.goal/scale*width
		fmt.Fprintf(&sb, `<text x="%d" y="%d" text-anchor="end">%s</text>`+"\n", left-8, y+16, html.EscapeString(b.label))
		fmt.Fprintf(&sb, `<rect x="%d" y="%d" width="%.1f" height="20" fill="%s"/>`+"\n", left, y+3, w, colour)
		fmt.Fprintf(&sb, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="black" stroke-width="2" stroke-dasharray="3,2"/>`+"\n", gx, y, gx, y+26)
		fmt.Fprintf(&sb, `<text x="%.1f" y="%d">%.2f (%s)</text>`+"\n", float64(left)+max(w, b.goal/scale*width)+6, y+16, b.ratio, html.EscapeString(b.target))
	}
	sb.WriteString("</svg>\n")
	return sb.String()
}
