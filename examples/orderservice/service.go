package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/sqloutbox/outbox"
	"github.com/sqloutbox/outbox/driver"
)

// service is the HTTP face of the order domain. outbox.Middleware gives
// every request its own emit scope; handlers begin transactions with the
// request's context and call plain domain functions that emit.
type service struct {
	db     *sql.DB
	orders *orders
}

func newService(db *sql.DB, d driver.Dialect) *service {
	o := &orders{ph: func(int) string { return "?" }, forUpdate: " FOR UPDATE"}
	switch d {
	case driver.Postgres:
		o.ph = func(n int) string { return fmt.Sprintf("$%d", n) }
	case driver.SQLite:
		o.forUpdate = "" // BEGIN IMMEDIATE serializes writers
	}
	return &service{db: db, orders: o}
}

func (s *service) migrate(ctx context.Context) error {
	_, err := s.db.ExecContext(ctx, "CREATE TABLE IF NOT EXISTS svc_order (id VARCHAR(64) PRIMARY KEY, status VARCHAR(16) NOT NULL, amount_cents BIGINT NOT NULL)")
	return err
}

// handler routes: POST /orders {"id","amount_cents"}, POST /orders/{id}/pay, GET /orders/{id}.
func (s *service) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ID          string `json:"id"`
			AmountCents int64  `json:"amount_cents"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.ID == "" || req.AmountCents <= 0 {
			http.Error(w, "want {\"id\": \"...\", \"amount_cents\": n > 0}", http.StatusBadRequest)
			return
		}
		s.inTx(w, r, http.StatusCreated, func(ctx context.Context, tx *sql.Tx) error { return s.orders.Create(ctx, tx, req.ID, req.AmountCents) })
	})
	mux.HandleFunc("POST /orders/{id}/pay", func(w http.ResponseWriter, r *http.Request) {
		s.inTx(w, r, http.StatusOK, func(ctx context.Context, tx *sql.Tx) error { return s.orders.Pay(ctx, tx, r.PathValue("id")) })
	})
	mux.HandleFunc("GET /orders/{id}", func(w http.ResponseWriter, r *http.Request) {
		ev, err := s.orders.Get(r.Context(), s.db, r.PathValue("id"))
		if err != nil {
			writeErr(w, err)
			return
		}
		_ = json.NewEncoder(w).Encode(ev)
	})
	return outbox.Middleware(mux)
}

// inTx runs fn in a transaction (outbox.InTx: a fresh emit scope, BEGIN,
// fn, COMMIT, or ROLLBACK if fn fails) and answers okStatus: the events fn
// emitted are written just before COMMIT and published after it.
func (s *service) inTx(w http.ResponseWriter, r *http.Request, okStatus int, fn func(ctx context.Context, tx *sql.Tx) error) {
	if err := outbox.InTx(r.Context(), s.db, fn); err != nil {
		writeErr(w, err)
		return
	}
	w.WriteHeader(okStatus)
}

func writeErr(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, errNotFound):
		http.Error(w, err.Error(), http.StatusNotFound)
	case errors.Is(err, errTransition):
		http.Error(w, err.Error(), http.StatusConflict)
	case errors.Is(err, outbox.ErrInvalidEvent):
		http.Error(w, err.Error(), http.StatusUnprocessableEntity)
	default:
		http.Error(w, "internal error", http.StatusInternalServerError)
	}
}
