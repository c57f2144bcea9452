# Fuzzing the HTTP parser (src/shared/nw_http.c) and the frame decoder
# (src/shared/nw_frame.c). Run from this directory:
#   make -f fuzz.mk fuzz            build ./fuzz_http and ./fuzz_frame with clang and libFuzzer
#   make -f fuzz.mk run FUZZ_TIME=300  fuzz the parser for that long (one job); new
#                          inputs go to work/, crashes to findings/
#   make -f fuzz.mk run-frame FUZZ_TIME=300  the same for the frame decoder
#                          (work-frame/, findings-frame/)
#   make -f fuzz.mk run-proxy FUZZ_TIME=300  the same for the PROXY protocol
#                          parser (work-proxy/, findings-proxy/)
#   make -f fuzz.mk run-tls FUZZ_TIME=300  the same for the TLS handshake
#                          step (work-tls/, findings-tls/)
#   make -f fuzz.mk replay          build ./replay, ./replay_frame, ./replay_proxy
#                          and ./replay_tls with gcc and replay corpus/,
#                          corpus-frame/, corpus-proxy/ and corpus-tls/
#   make -f fuzz.mk clean
# What each harness links with comes from its includes
# (../inc/NarwhalLink.pm, the build description the C unit tests and
# Makefile.PL share), libraries too (--libs: OpenSSL for fuzz_tls).
CLANG   ?= clang
GCC     ?= gcc
PERL    ?= perl
FUZZ_TIME ?= 300
LINK     = $(shell $(PERL) ../inc/NarwhalLink.pm $(1))
HTTP     := $(call LINK,fuzz_http.c)
FRAME    := $(call LINK,fuzz_frame.c)
PROXY    := $(call LINK,fuzz_proxy.c)
TLS      := $(call LINK,fuzz_tls.c)
TLS_LIBS := $(shell $(PERL) ../inc/NarwhalLink.pm --libs fuzz_tls.c)
HDRS     = $(wildcard ../src/*/*.h)
INCS     = -I../src/shared -I../src/worker -I../src/manager

.PHONY: all fuzz run run-frame run-proxy run-tls replay clean

all: fuzz replay

fuzz: fuzz_http fuzz_frame fuzz_proxy fuzz_tls

fuzz_tls: $(TLS) $(HDRS)
	$(CLANG) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
		$(INCS) $(TLS) $(TLS_LIBS) -o $@

run-tls: fuzz_tls
	mkdir -p work-tls findings-tls
	./fuzz_tls -max_total_time=$(FUZZ_TIME) -max_len=4096 -artifact_prefix=findings-tls/ \
		-print_final_stats=1 work-tls corpus-tls

fuzz_proxy: $(PROXY) $(HDRS)
	$(CLANG) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
		$(INCS) $(PROXY) -o $@

run-proxy: fuzz_proxy
	mkdir -p work-proxy findings-proxy
	./fuzz_proxy -max_total_time=$(FUZZ_TIME) -max_len=2048 -artifact_prefix=findings-proxy/ \
		-print_final_stats=1 work-proxy corpus-proxy

fuzz_http: $(HTTP) $(HDRS)
	$(CLANG) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
		$(INCS) $(HTTP) -o $@

fuzz_frame: $(FRAME) $(HDRS)
	$(CLANG) -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
		$(INCS) $(FRAME) -o $@

run-frame: fuzz_frame
	mkdir -p work-frame findings-frame
	./fuzz_frame -max_total_time=$(FUZZ_TIME) -max_len=4096 \
		-artifact_prefix=findings-frame/ -print_final_stats=1 work-frame corpus-frame

run: fuzz_http
	mkdir -p work findings
	./fuzz_http -max_total_time=$(FUZZ_TIME) -max_len=8192 -dict=http.dict \
		-artifact_prefix=findings/ -print_final_stats=1 work corpus

replay: replay.c $(HTTP) $(FRAME) $(PROXY) $(TLS) $(HDRS)
	$(GCC) -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all \
		$(INCS) replay.c $(HTTP) -o replay
	./replay corpus
	$(GCC) -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all \
		$(INCS) replay.c $(FRAME) -o replay_frame
	./replay_frame corpus-frame
	$(GCC) -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all \
		$(INCS) replay.c $(PROXY) -o replay_proxy
	./replay_proxy corpus-proxy
	$(GCC) -g -O1 -fsanitize=address,undefined -fno-sanitize-recover=all \
		$(INCS) replay.c $(TLS) $(TLS_LIBS) -o replay_tls
	./replay_tls corpus-tls

clean:
	rm -rf fuzz_http fuzz_frame fuzz_proxy fuzz_tls replay replay_frame replay_proxy replay_tls \
		work findings work-frame findings-frame work-proxy findings-proxy work-tls findings-tls
