module github.com/kvroute/kvroute

go 1.26.8

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	github.com/prometheus/client_golang v1.25.0 // indirect
	github.com/prometheus/common v0.73.1 // indirect
	go.yaml.in/yaml/v3 v3.0.6 // indirect
)
