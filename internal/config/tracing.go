package config

// Tracing is the OpenTelemetry tracing section. The exporter is OTLP; where
// it sends and how is read from the standard environment variables
// (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_TRACES_ENDPOINT,
// OTEL_EXPORTER_OTLP_HEADERS, OTEL_EXPORTER_OTLP_PROTOCOL, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, ...), which the keys below override when set.
type Tracing struct {
	// Enabled turns tracing on: one span per request, with children for
	// the admission wait, the routing decision, each upstream attempt and
	// its first byte; the client's W3C traceparent is continued and
	// propagated to the engine. Default false (`--tracing` turns it on).
	Enabled bool `yaml:"enabled"`
	// Endpoint is the OTLP collector's URL, e.g. http://otel-collector:4318
	// (http/protobuf) or http://otel-collector:4317 (grpc). Default "": the
	// OTEL_EXPORTER_OTLP_* variables, else the exporter's localhost default.
	Endpoint string `yaml:"endpoint"`
	// Protocol is http/protobuf or grpc. Default "":
	// OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, OTEL_EXPORTER_OTLP_PROTOCOL, else
	// http/protobuf.
	Protocol string `yaml:"protocol"`
	// SampleRatio is the share of new traces sampled, 0 to 1; a request
	// whose client sent a sampled traceparent is always traced (parent-based
	// sampling). Default 1.
	SampleRatio float64 `yaml:"sample_ratio"`
	// ServiceName is the service.name resource attribute. Default "kvroute"
	// (OTEL_SERVICE_NAME wins when set).
	ServiceName string `yaml:"service_name"`
}

// Tracing protocols.
const (
	ProtocolHTTP = "http/protobuf"
	ProtocolGRPC = "grpc"
)

func defaultTracing() Tracing { return Tracing{SampleRatio: 1, ServiceName: "kvroute"} }

func (t *Tracing) validate(bad func(string, ...any)) {
	switch t.Protocol {
	case "", ProtocolHTTP, ProtocolGRPC:
	default:
		bad("tracing.protocol: %q is not %s or %s", t.Protocol, ProtocolHTTP, ProtocolGRPC)
	}
	if t.SampleRatio < 0 || t.SampleRatio > 1 {
		bad("tracing.sample_ratio: %g must be between 0 and 1", t.SampleRatio)
	}
	if t.Endpoint != "" {
		if _, err := ParseBackendURL(t.Endpoint); err != nil {
			bad("tracing.endpoint: %v", err)
		}
	}
}
