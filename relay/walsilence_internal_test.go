package relay

import (
	"testing"
	"time"
)

// TestReceiveTimeout: WALConfig.ReceiveTimeout defaults to 60 s only when
// unset; a negative one is kept and never presumes a silent stream dead
// (TestWALSilentStreamReconnects covers a positive one on a real
// connection).
func TestReceiveTimeout(t *testing.T) {
	t.Parallel()
	heard := time.Unix(1000, 0)
	for _, tc := range []struct {
		name   string
		set    time.Duration
		want   time.Duration
		silent time.Duration
		dead   bool
	}{
		{"unset: the default, silent less", 0, DefaultWALReceiveTimeout, 59 * time.Second, false},
		{"unset: the default, silent at it", 0, DefaultWALReceiveTimeout, 60 * time.Second, false},
		{"unset: the default, silent past it", 0, DefaultWALReceiveTimeout, 61 * time.Second, true},
		{"set", 3 * time.Second, 3 * time.Second, 4 * time.Second, true},
		{"set, silent less", 3 * time.Second, 3 * time.Second, 2 * time.Second, false},
		{"negative: never", -time.Second, -time.Second, 24 * time.Hour, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Source: SourceWAL, WAL: WALConfig{ReceiveTimeout: tc.set}}.withDefaults()
			if cfg.WAL.ReceiveTimeout != tc.want {
				t.Fatalf("ReceiveTimeout %v after defaults = %v, want %v", tc.set, cfg.WAL.ReceiveTimeout, tc.want)
			}
			if got := presumedDead(cfg.WAL.ReceiveTimeout, heard, heard.Add(tc.silent)); got != tc.dead {
				t.Fatalf("silent %v under ReceiveTimeout %v: presumed dead %v, want %v", tc.silent, cfg.WAL.ReceiveTimeout, got, tc.dead)
			}
		})
	}
}
