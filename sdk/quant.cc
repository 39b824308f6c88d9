// PLACEHOLDER being written by the plugins helper: GGUF block formats.
#include "polychip/sdk/quant.h"
