package redisinfo

import "testing"

func TestCommands(t *testing.T) {
	info := "# Commandstats\r\ncmdstat_evalsha:calls=12,usec=60,usec_per_call=5.00,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_config|resetstat:calls=1,usec=3,usec_per_call=3.00\r\n# CPU\r\nused_cpu_sys:1.5\r\n"
	m := Commands(info)
	if got, want := m["evalsha"], (Stat{Calls: 12, Usec: 60, UsecPerCall: 5}); got != want {
		t.Errorf("evalsha = %+v, want %+v", got, want)
	}
	if got := m["config|resetstat"].Calls; got != 1 {
		t.Errorf("config|resetstat calls = %d, want 1", got)
	}
	if len(m) != 2 {
		t.Errorf("parsed %d commands (%v), want 2", len(m), m)
	}
}
