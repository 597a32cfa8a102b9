//go:build race

package main

// raceEnabled: under the race detector the image's layers are compressed
// some tenfold slower, in the test binary itself (TestKvrouteImageSize).
const raceEnabled = true
