package members

import (
	"github.com/kvroute/kvroute/internal/config"
	"github.com/kvroute/kvroute/internal/fleet"
)

// RoleOf is backend b's role in disaggregated serving: its entry's
// (backends[].role, or its pod's kvroute.io/role label for a Kubernetes
// pool), both for a backend without a record.
func (s *Set) RoleOf(b *fleet.Backend) string {
	if m := s.Of(b); m != nil {
		return config.RoleOf(&m.Entry.Backend)
	}
	return config.RoleBoth
}
