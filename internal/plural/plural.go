// Package plural writes counts in messages: 1 request, 2 requests.
package plural

import "strconv"

// Count writes n with the noun that agrees with it: Count(1, "request",
// "requests") is "1 request", Count(2, ...) "2 requests".
func Count[N ~int | ~int64](n N, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return strconv.FormatInt(int64(n), 10) + " " + many
}
