// Package libs measures JSON libraries on the bodies of request.Parse's
// benchmarks, for the comparison in docs/benchmarks.md ("Parse"). It is a
// module of its own so that kvroute does not depend on them.
package libs
