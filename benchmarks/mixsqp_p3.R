# R side of benchmarks/bench_npmle.py: the same grid NPMLE by mixsqp (Kim et al. 2020).
#
# Usage: Rscript mixsqp_p3.R DIR
# DIR holds x.bin, s.bin and grid.bin (little-endian float64). The likelihood matrix
# L[i, k] = dnorm(x[i], grid[k], s[i]) is built with dnorm, then mixsqp(L) is called with
# its default settings. Prints one JSON line: the seconds to build L, the seconds of
# mixsqp, its iterations and status, and the log-likelihood sum_i log((L w)_i) of its
# weights (with the normal constant, as ebfl.npmle_normal reports it).
suppressPackageStartupMessages(library(mixsqp))

read_doubles <- function(path) {
  readBin(path, what = "double", n = file.size(path) / 8, size = 8, endian = "little")
}

args <- commandArgs(trailingOnly = TRUE)
dir <- args[1]
x <- read_doubles(file.path(dir, "x.bin"))
s <- read_doubles(file.path(dir, "s.bin"))
grid <- read_doubles(file.path(dir, "grid.bin"))

t0 <- proc.time()[["elapsed"]]
# outer() fills column by column, so sd = s (length n) is recycled down every column.
L <- dnorm(outer(x, grid, "-"), sd = s)
t1 <- proc.time()[["elapsed"]]
fit <- mixsqp(L, control = list(verbose = FALSE))
t2 <- proc.time()[["elapsed"]]

loglik <- sum(log(drop(L %*% fit$x)))
cat(sprintf(paste0('{"likelihood_matrix_seconds": %.6f, "mixsqp_seconds": %.6f, ',
                   '"iterations": %d, "status": "%s", "log_likelihood": %.17g, ',
                   '"mixsqp_version": "%s", "blas": "%s"}\n'),
            t1 - t0, t2 - t1, nrow(fit$progress), fit$status, loglik,
            as.character(packageVersion("mixsqp")),
            extSoftVersion()[["BLAS"]]))
