//go:build !race

package compare

// raceEnabled reports whether the race detector is on; it slows the live
// path several times over.
const raceEnabled = false
