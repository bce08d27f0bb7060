package outbox_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/emit"
)

// TestMiddlewareGivesEachRequestItsOwnScope: handlers see a scope, and
// two requests never share one.
func TestMiddlewareGivesEachRequestItsOwnScope(t *testing.T) {
	t.Parallel()
	var scopes []*emit.Scope
	h := outbox.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := emit.FromContext(r.Context())
		if s == nil {
			t.Error("no scope in the request context")
		}
		scopes = append(scopes, s)
		// No transaction yet: Emit says so instead of guessing.
		if err := outbox.Emit(r.Context(), outbox.Event{AggregateType: "a", AggregateID: "1", Type: "t", Payload: []byte(`1`)}); !errors.Is(err, outbox.ErrNoTransaction) {
			t.Errorf("Emit = %v, want ErrNoTransaction", err)
		}
	}))
	for i := 0; i < 2; i++ {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/orders", nil))
	}
	if len(scopes) != 2 || scopes[0] == scopes[1] {
		t.Fatalf("scopes %v: want two distinct", scopes)
	}
}
