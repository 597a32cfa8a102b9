package config

import (
	"context"
	"crypto/sha256"
	"os"
	"time"
)

// fingerprint identifies one version of a file. The content hash catches
// an edit that kept the size within the file system's timestamp
// resolution; the modification time catches a rewrite with equal content
// (an explicit "touch to reload").
type fingerprint struct {
	mod  time.Time
	size int64
	sum  [sha256.Size]byte
}

func readFingerprint(path string) (fingerprint, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return fingerprint{}, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return fingerprint{}, err
	}
	return fingerprint{mod: st.ModTime(), size: int64(len(b)), sum: sha256.Sum256(b)}, nil
}

// Watch checks the file at path every interval and calls onChange (on
// Watch's goroutine) whenever its modification time, size or content
// changed, until ctx is done. A change counts once the file has read the
// same at two checks in a row, so that a file caught mid-write (truncated,
// then written) gives one reload of the finished file rather than one of
// each state. A file that cannot be read (an editor replacing it, say)
// counts as unchanged until it can be read again. Watch blocks; run it on
// a goroutine of its own.
func Watch(ctx context.Context, path string, interval time.Duration, onChange func()) {
	last, _ := readFingerprint(path)
	seen := last // the state at the previous check
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fp, err := readFingerprint(path)
		if err != nil {
			continue
		}
		settled := fp == seen
		seen = fp
		if !settled || fp == last {
			continue
		}
		last = fp
		onChange()
	}
}
