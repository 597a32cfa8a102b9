//go:build race

package sim

// raceEnabled: the race detector slows the simulator some tenfold, which
// the routing-quality table cannot afford (TestRoutingQuality).
const raceEnabled = true
