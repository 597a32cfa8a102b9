//go:build race

package racetest

// Enabled is true under the race detector.
const Enabled = true
