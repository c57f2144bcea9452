# Fuzzing the HTTP parser (src/nw_http.c). Run from this directory:
#   make -f fuzz.mk fuzz            build ./fuzz_http with clang and libFuzzer
#   make -f fuzz.mk run FUZZ_TIME=300  fuzz for that long (one job); new inputs go to
#                          work/, crashes to findings/
#   make -f fuzz.mk replay          build ./replay with gcc and replay corpus/
#   make -f fuzz.mk clean
CLANG   ?= clang
GCC     ?= gcc
FUZZ_TIME ?= 300
SRC      = ../src/nw_http.c
HDRS     = ../src/nw_http.h ../src/nw_limits.h

.PHONY: all fuzz run replay clean

all: fuzz replay

fuzz: fuzz_http

fuzz_http: fuzz_http.c $(SRC) $(HDRS)
	$(CLANG) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
		-I../src fuzz_http.c $(SRC) -o $@

run: fuzz_http
	mkdir -p work findings
	./fuzz_http -max_total_time=$(FUZZ_TIME) -max_len=8192 -dict=http.dict \
		-artifact_prefix=findings/ -print_final_stats=1 work corpus

replay: replay.c fuzz_http.c $(SRC) $(HDRS)
	$(GCC) -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all \
		-I../src replay.c fuzz_http.c $(SRC) -o replay
	./replay corpus

clean:
	rm -rf fuzz_http replay work findings
