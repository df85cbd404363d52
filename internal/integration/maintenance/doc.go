// Package maintenance holds the tests of the background services
// (package github.com/idem-go/idem/maintenance) over every real store.
package maintenance
