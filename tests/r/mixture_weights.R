# R peers of ebfl's mixture-weights solver, for tests/test_mixture_weights_peers.py.
#
# Usage: Rscript mixture_weights.R DIR
# DIR/cases.txt lists one case a line: NAME KIND N K, KIND "mixsqp" or "ebnm".
# mixsqp: DIR/NAME_L.bin is the N x K likelihood matrix (row-major little-endian
#   float64); mixsqp(L) runs with its defaults.
# ebnm: DIR/NAME_x.bin, NAME_s.bin (N) and NAME_grid.bin (K); ebnm_npmle(x, s) runs on
#   that grid (g_init a mixture of point masses at the grid points, fix_g = FALSE).
# Prints one JSON line: for each case its weights and log-likelihood
# (sum_i log sum_k w_k L_ik, for ebnm with the normal constant, as ebfl reports it).
read_doubles <- function(path) {
  readBin(path, what = "double", n = file.size(path) / 8, size = 8, endian = "little")
}
args <- commandArgs(trailingOnly = TRUE)
dir <- args[1]
cases <- read.table(file.path(dir, "cases.txt"), stringsAsFactors = FALSE,
                    col.names = c("name", "kind", "n", "k"))
out <- character(0)
for (r in seq_len(nrow(cases))) {
  name <- cases$name[r]
  kind <- cases$kind[r]
  if (kind == "mixsqp") {
    suppressPackageStartupMessages(library(mixsqp))
    L <- matrix(read_doubles(file.path(dir, paste0(name, "_L.bin"))), nrow = cases$n[r],
                ncol = cases$k[r], byrow = TRUE)
    fit <- mixsqp(L, control = list(verbose = FALSE))
    w <- fit$x
    loglik <- sum(log(drop(L %*% w)))
    version <- as.character(packageVersion("mixsqp"))
  } else {
    suppressPackageStartupMessages({library(ebnm); library(ashr)})
    x <- read_doubles(file.path(dir, paste0(name, "_x.bin")))
    s <- read_doubles(file.path(dir, paste0(name, "_s.bin")))
    grid <- read_doubles(file.path(dir, paste0(name, "_grid.bin")))
    k <- length(grid)
    fit <- ebnm_npmle(x, s, g_init = normalmix(rep(1 / k, k), grid, rep(0, k)), fix_g = FALSE)
    w <- fit$fitted_g$pi
    loglik <- as.numeric(fit$log_likelihood)
    version <- as.character(packageVersion("ebnm"))
  }
  out <- c(out, sprintf('"%s": {"log_likelihood": %.17g, "version": "%s", "weights": [%s]}',
                        name, loglik, version,
                        paste(sprintf("%.17g", w), collapse = ", ")))
}
cat("{", paste(out, collapse = ", "), "}\n")
