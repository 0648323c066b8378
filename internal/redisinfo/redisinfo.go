// Package redisinfo reads the per-command statistics of a Redis server's
// INFO commandstats, for the tests and benchmarks that count the commands a
// lock operation sends or the server time it costs.
package redisinfo

import (
	"strconv"
	"strings"
)

// Stat is one command's line of INFO commandstats.
type Stat struct {
	Calls       int64
	Usec        int64   // server time spent in the command, µs
	UsecPerCall float64 // Usec / Calls as the server rounds it
}

// Commands parses the text of INFO commandstats (lines
// "cmdstat_<cmd>:calls=N,usec=N,usec_per_call=F,..."; other lines, such as
// another section's, are passed over) into its statistics by command name
// ("evalsha", "config|resetstat"). A field it cannot read is left zero.
func Commands(info string) map[string]Stat {
	m := map[string]Stat{}
	for _, line := range strings.Split(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_")
		if !ok {
			continue
		}
		cmd, fields, _ := strings.Cut(rest, ":")
		var s Stat
		for _, f := range strings.Split(fields, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				s.Calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				s.Usec, _ = strconv.ParseInt(v, 10, 64)
			case "usec_per_call":
				s.UsecPerCall, _ = strconv.ParseFloat(v, 64)
			}
		}
		m[cmd] = s
	}
	return m
}
