// Package postgres keeps the sessions of package ha's replicas in
// PostgreSQL: a [Store] for [ha.New] and [ha.Join] on a *pgxpool.Pool the
// service already has, and [Held], the fence inside the service's own
// transaction.
package postgres
