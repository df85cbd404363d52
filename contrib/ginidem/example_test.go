package ginidem_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/gin-gonic/gin"
	"github.com/idem-go/idem"
	"github.com/idem-go/idem/contrib/ginidem"
	"github.com/idem-go/idem/store/memory"
)

func ExampleMiddleware() {
	engine, err := idem.New(memory.New(memory.Config{}), idem.Config{})
	if err != nil {
		panic(err)
	}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(gin.Recovery()) // before the middleware: it answers a panic
	v1 := r.Group("/v1", ginidem.Middleware(engine))
	captures := 0
	v1.POST("/charges/:id/capture", func(c *gin.Context) {
		captures++
		c.JSON(http.StatusCreated, gin.H{"charge": c.Param("id"), "captured": true})
	})

	for i := 0; i < 2; i++ {
		req := httptest.NewRequest("POST", "/v1/charges/ch_1/capture", strings.NewReader(`{}`))
		req.Header.Set("Idempotency-Key", "capture-ch_1")
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		fmt.Printf("%d %s replayed=%q\n", w.Code, w.Body, w.Header().Get("Idempotent-Replayed"))
	}
	fmt.Println("captures:", captures)
	// Output:
	// 201 {"captured":true,"charge":"ch_1"} replayed=""
	// 201 {"captured":true,"charge":"ch_1"} replayed="true"
	// captures: 1
}
