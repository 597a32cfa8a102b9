// Package deploy holds what runs and watches kvroute in a cluster: the
// Grafana dashboard (grafana/kvroute.json) and the Helm chart
// (helm/kvroute); docs/deploy.md walks through both.
//
// It has no code of its own. Its tests keep the artefacts honest against
// the router they describe: every metric the dashboard queries is one that
// kvroute serve registers (read off a live router's /metrics) or an engine
// metric whose name was looked up in the engine's source, and the chart
// renders Kubernetes objects that decode strictly and a kvroute config
// that the router's own loader accepts. The tests sit beside the files
// they check, rather than under internal/, because nothing here is a
// package that other code imports.
package deploy
