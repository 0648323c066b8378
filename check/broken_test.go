package check

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/dlock/dlock/check/internal/broken"
)

// TestBrokenDriver shows the checker catching a lock that breaks each of
// its promises: every mode of the broken driver must fail the run with the
// violation class that mode produces.
func TestBrokenDriver(t *testing.T) {
	for _, tc := range []struct {
		mode   string
		faults []string
		class  string
	}{
		{broken.GrantTwice, nil, ClassValidityOverlap},
		{broken.ReuseTokens, nil, ClassDuplicateToken},
		{broken.ReleaseAny, nil, ClassLateUnlock},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			url := "checkbroken://" + filepath.Join(t.TempDir(), "store.json") + "?mode=" + tc.mode
			_, rep := runCheck(t, Config{URL: url, Faults: tc.faults, Duration: 4 * time.Second})
			if !rep.Failed() {
				t.Fatalf("the checker passed a driver in mode %s", tc.mode)
			}
			for _, c := range rep.Classes {
				if c.Name == tc.class && c.Unadmitted == 0 {
					t.Errorf("mode %s: no unadmitted %s violation", tc.mode, tc.class)
				}
			}
		})
	}
}
