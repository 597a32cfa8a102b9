package compare

import "github.com/kvroute/kvroute/internal/sim"

// fleetsOf are the fleets of a comparison: with roles, the aggregated one
// and the disaggregated one, named as the simulator names its conditional
// run (sim.FleetVariants) and run by the router as its config says (the
// proxy splits requests as disagg and its decider say); without, the
// aggregated one.
func fleetsOf(roles []string) []sim.Variant {
	return sim.FleetVariants(roles, []string{sim.SplitConditional})
}

// roleOf is engine i's role on fleet f, "" (both) on an aggregated one.
func roleOf(f sim.Variant, i int) string {
	if f.Roles == nil {
		return ""
	}
	return f.Roles[i]
}
