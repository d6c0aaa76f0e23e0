"""What torch 2.13.0's type stubs say returns a tensor: generated, do not edit.

Regenerate with `python -m dplint.analysis.torch_stubs dplint/analysis/tensor_api.py`.
"""

TORCH_VERSION = "2.13.0"

# `torch.<name>(...)` is a tensor (every overload).
TORCH_FUNCTIONS = frozenset(
    """abs abs_ absolute acos acos_ acosh acosh_ adaptive_avg_pool1d add addbmm addcdiv addcmul addmm addmv
    addmv_ addr adjoint affine_grid_generator alias_copy all alpha_dropout alpha_dropout_ amax amin angle
    any arange arccos arccos_ arccosh arccosh_ arcsin arcsin_ arcsinh arcsinh_ arctan arctan2 arctan_
    arctanh arctanh_ argmax argmin argsort argwhere as_strided as_strided_ as_strided_copy
    as_strided_scatter as_tensor asarray asin asin_ asinh asinh_ atan atan2 atan_ atanh atanh_ avg_pool1d
    baddbmm bartlett_window batch_norm batch_norm_backward_elemt batch_norm_elemt bernoulli bilinear
    binary_cross_entropy_with_logits bincount binomial bitwise_and bitwise_left_shift bitwise_not bitwise_or
    bitwise_right_shift bitwise_xor blackman_window bmm broadcast_to bucketize cartesian_prod cat
    ccol_indices_copy ceil ceil_ celu celu_ channel_shuffle cholesky cholesky_inverse cholesky_solve clamp
    clamp_ clamp_max clamp_max_ clamp_min clamp_min_ clip clip_ clone col_indices_copy column_stack
    combinations complex concat concatenate conj conj_physical conj_physical_ constant_pad_nd conv1d conv2d
    conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d convolution copysign corrcoef cos
    cos_ cosh cosh_ cosine_embedding_loss cosine_similarity count_nonzero cov cross crow_indices_copy
    ctc_loss cudnn_affine_grid_generator cudnn_convolution cudnn_convolution_add_relu cudnn_convolution_relu
    cudnn_convolution_transpose cudnn_grid_sampler cumprod cumsum cumulative_trapezoid deg2rad deg2rad_ det
    detach detach_ detach_copy diag diag_embed diagflat diagonal diagonal_copy diagonal_scatter diff digamma
    dist div divide dot dropout dropout_ dsmm dstack einsum embedding embedding_renorm_ empty empty_like
    empty_permuted empty_quantized empty_strided eq erf erf_ erfc erfc_ erfinv exp exp2 exp2_ exp_
    expand_copy expm1 expm1_ eye fake_quantize_per_channel_affine fake_quantize_per_tensor_affine
    fbgemm_linear_fp16_weight fbgemm_linear_fp16_weight_fp32_activation fbgemm_linear_int8_weight
    fbgemm_linear_int8_weight_fp32_activation fbgemm_pack_gemm_matrix_fp16 fbgemm_pack_quantized_matrix
    feature_alpha_dropout feature_alpha_dropout_ feature_dropout feature_dropout_ fill fill_ fix fix_
    flatten flip fliplr flipud float_power floor floor_ floor_divide fmax fmin fmod frac frac_
    frobenius_norm from_file from_numpy frombuffer full full_like fused_moving_avg_obs_fake_quant gather gcd
    gcd_ ge ger greater greater_equal grid_sampler grid_sampler_2d grid_sampler_3d group_norm gru_cell gt
    hamming_window hann_window hardshrink hash_tensor heaviside hinge_embedding_loss histc hsmm hspmm hstack
    hypot i0 i0_ igamma igammac imag index_add index_copy index_fill index_put index_put_ index_reduce
    index_select indices_copy inner instance_norm int_repr inverse isclose isfinite isin isinf isnan
    isneginf isposinf isreal istft kaiser_window kl_div kron layer_norm lcm lcm_ ldexp ldexp_ le lerp less
    less_equal lgamma linspace log log10 log10_ log1p log1p_ log2 log2_ log_ log_softmax logaddexp
    logaddexp2 logcumsumexp logdet logical_and logical_not logical_or logical_xor logit logit_ logspace
    logsumexp lt lu_solve margin_ranking_loss masked_fill masked_scatter masked_select matmul matrix_exp
    matrix_power max_pool1d max_pool2d max_pool3d maximum mean minimum miopen_convolution
    miopen_convolution_add_relu miopen_convolution_relu miopen_convolution_transpose
    miopen_depthwise_convolution mkldnn_adaptive_avg_pool2d mkldnn_convolution mkldnn_max_pool2d
    mkldnn_max_pool3d mm moveaxis movedim msort mul multinomial multiply mv mvlgamma nan_to_num nan_to_num_
    nanmean nanquantile nansum narrow narrow_copy native_channel_shuffle native_norm ne neg neg_ negative
    negative_ nextafter nonzero_static norm_except_dim normal not_equal nuclear_norm ones ones_like orgqr
    ormqr outer pairwise_distance pdist permute permute_copy pinverse pixel_shuffle pixel_unshuffle poisson
    poisson_nll_loss polar polygamma positive pow prelu prod put q_per_channel_scales
    q_per_channel_zero_points quantile quantize_per_channel quantize_per_tensor_dynamic quantized_batch_norm
    quantized_gru_cell quantized_max_pool1d quantized_max_pool2d quantized_max_pool3d
    quantized_rnn_relu_cell quantized_rnn_tanh_cell rad2deg rad2deg_ rand rand_like randint randint_like
    randn randn_like randperm range ravel real reciprocal reciprocal_ relu relu_ remainder renorm
    repeat_interleave reshape resize_as_ resize_as_sparse_ resolve_conj resolve_neg rms_norm rnn_relu_cell
    rnn_tanh_cell roll rot90 round round_ row_indices_copy row_stack rrelu rrelu_ rsqrt rsqrt_ rsub saddmm
    scalar_tensor scatter scatter_add scatter_reduce searchsorted segment_reduce select select_copy
    select_scatter selu selu_ sgn sigmoid sigmoid_ sign signbit sin sin_ sinc sinc_ sinh sinh_ slice_copy
    slice_inverse slice_scatter smm softmax sparse_bsc_tensor sparse_bsr_tensor sparse_compressed_tensor
    sparse_coo_tensor sparse_csc_tensor sparse_csr_tensor spmm sqrt sqrt_ square square_ squeeze
    squeeze_copy sspaddmm stack std stft sub subtract sum swapaxes swapdims t t_copy take take_along_dim tan
    tan_ tanh tanh_ tensor threshold threshold_ tile trace transpose transpose_copy trapezoid trapz tril
    tril_indices triplet_margin_loss triu triu_indices true_divide trunc trunc_ unflatten unfold_copy
    unsqueeze unsqueeze_copy values_copy vander var vdot view_as_complex view_as_complex_copy view_as_real
    view_as_real_copy view_copy vstack xlogy xlogy_ zero_ zeros zeros_like""".split()
)

# `torch.<name>(...)` is a tuple or list of tensors (every overload).
TORCH_FUNCTIONS_SEQUENCE = frozenset(
    """adaptive_max_pool1d batch_norm_backward_reduce batch_norm_gather_stats
    batch_norm_gather_stats_with_counts batch_norm_stats batch_norm_update_stats choose_qparams_optimized
    chunk cudnn_batch_norm dsplit embedding_bag gradient gru hsplit lstm lstm_cell max_pool1d_with_indices
    meshgrid miopen_batch_norm miopen_ctc_loss miopen_rnn mkldnn_linear_backward_weights mkldnn_rnn_layer
    native_batch_norm native_dropout native_group_norm native_layer_norm quantized_lstm_cell rnn_relu
    rnn_tanh split split_with_sizes std_mean tensor_split unbind unique_dim unravel_index unsafe_chunk
    unsafe_split unsafe_split_with_sizes var_mean vsplit""".split()
)

# `torch.nn.functional.<name>(...)` is a tensor (every overload).
FUNCTIONAL_FUNCTIONS = frozenset(
    """adaptive_avg_pool1d adaptive_avg_pool2d adaptive_avg_pool3d affine_grid alpha_dropout avg_pool1d
    avg_pool2d avg_pool3d batch_norm bilinear binary_cross_entropy binary_cross_entropy_with_logits celu
    celu_ channel_shuffle conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d
    cosine_embedding_loss cosine_similarity cross_entropy ctc_loss dropout dropout1d dropout2d dropout3d elu
    elu_ embedding embedding_bag feature_alpha_dropout fold gaussian_nll_loss gelu glu grid_sample
    group_norm grouped_mm gumbel_softmax hardshrink hardsigmoid hardswish hardtanh hardtanh_
    hinge_embedding_loss huber_loss instance_norm interpolate kl_div l1_loss layer_norm leaky_relu
    leaky_relu_ linear linear_cross_entropy local_response_norm log_softmax logsigmoid lp_pool1d lp_pool2d
    lp_pool3d margin_ranking_loss max_unpool1d max_unpool2d max_unpool3d mish mse_loss multi_margin_loss
    multilabel_margin_loss multilabel_soft_margin_loss native_channel_shuffle nll_loss normalize one_hot pad
    pairwise_distance pdist pixel_shuffle pixel_unshuffle poisson_nll_loss prelu relu relu6 relu_ rms_norm
    rrelu rrelu_ scaled_dot_product_attention scaled_mm selu selu_ sigmoid silu smooth_l1_loss
    soft_margin_loss softmax softmin softplus softshrink softsign tanh tanhshrink threshold
    triplet_margin_loss triplet_margin_with_distance_loss unfold upsample upsample_bilinear upsample_nearest""".split()
)

# `torch.nn.functional.<name>(...)` is a tuple or list of tensors (every overload).
FUNCTIONAL_FUNCTIONS_SEQUENCE = frozenset(
    """adaptive_max_pool1d_with_indices adaptive_max_pool2d_with_indices adaptive_max_pool3d_with_indices
    fractional_max_pool2d_with_indices fractional_max_pool3d_with_indices max_pool1d_with_indices
    max_pool2d_with_indices max_pool3d_with_indices""".split()
)

# `tensor.<name>(...)` is a tensor (every overload).
TENSOR_METHODS = frozenset(
    """abs abs_ absolute absolute_ acos acos_ acosh acosh_ add add_ addbmm addbmm_ addcdiv addcdiv_ addcmul
    addcmul_ addmm addmm_ addmv addmv_ addr addr_ adjoint all amax amin angle any apply_ arccos arccos_
    arccosh arccosh_ arcsin arcsin_ arcsinh arcsinh_ arctan arctan2 arctan2_ arctan_ arctanh arctanh_ argmax
    argmin argsort argwhere as_strided as_strided_ as_strided_scatter asin asin_ asinh asinh_ atan atan2
    atan2_ atan_ atanh atanh_ baddbmm baddbmm_ bernoulli bernoulli_ bfloat16 bincount bitwise_and
    bitwise_and_ bitwise_left_shift bitwise_left_shift_ bitwise_not bitwise_not_ bitwise_or bitwise_or_
    bitwise_right_shift bitwise_right_shift_ bitwise_xor bitwise_xor_ bmm bool broadcast_to byte cauchy_
    ccol_indices ceil ceil_ chalf char cholesky cholesky_inverse cholesky_solve clamp clamp_ clamp_max
    clamp_max_ clamp_min clamp_min_ clip clip_ clone coalesce col_indices conj conj_physical conj_physical_
    contiguous copy_ copysign copysign_ corrcoef cos cos_ cosh cosh_ count_nonzero cov cpu cross
    crow_indices cuda cumprod cumprod_ cumsum cumsum_ deg2rad deg2rad_ dequantize det detach detach_ diag
    diag_embed diagflat diagonal diagonal_scatter diff digamma digamma_ dist div div_ divide divide_ dot
    double eq eq_ erf erf_ erfc erfc_ erfinv erfinv_ exp exp2 exp2_ exp_ expand expand_as expm1 expm1_
    exponential_ fill_ fill_diagonal_ fix fix_ flatten flip fliplr flipud float float_power float_power_
    floor floor_ floor_divide floor_divide_ fmax fmin fmod fmod_ frac frac_ gather gcd gcd_ ge ge_
    geometric_ ger greater greater_ greater_equal greater_equal_ gt gt_ half hardshrink hash_tensor
    heaviside heaviside_ histc hypot hypot_ i0 i0_ igamma igamma_ igammac igammac_ index_add index_add_
    index_copy index_copy_ index_fill index_fill_ index_put index_put_ index_reduce index_reduce_
    index_select indices inner int int_repr inverse isclose isfinite isinf isnan isneginf isposinf isreal
    istft kron lcm lcm_ ldexp ldexp_ le le_ lerp lerp_ less less_ less_equal less_equal_ lgamma lgamma_ log
    log10 log10_ log1p log1p_ log2 log2_ log_ log_normal_ log_softmax logaddexp logaddexp2 logcumsumexp
    logdet logical_and logical_and_ logical_not logical_not_ logical_or logical_or_ logical_xor logical_xor_
    logit logit_ logsumexp long lt lt_ lu_solve map2_ map_ masked_fill masked_fill_ masked_scatter
    masked_scatter_ masked_select matmul matrix_exp matrix_power maximum mean minimum mm moveaxis movedim
    msort mul mul_ multinomial multiply multiply_ mv mvlgamma mvlgamma_ nan_to_num nan_to_num_ nanmean
    nanquantile nansum narrow narrow_copy ne ne_ neg neg_ negative negative_ new_empty new_empty_strided
    new_full new_ones new_tensor new_zeros nextafter nextafter_ nonzero_static normal_ not_equal not_equal_
    orgqr ormqr outer permute pin_memory pinverse polygamma polygamma_ positive pow pow_ prelu prod put put_
    q_per_channel_scales q_per_channel_zero_points quantile rad2deg rad2deg_ random_ ravel reciprocal
    reciprocal_ relu relu_ remainder remainder_ renorm renorm_ repeat repeat_interleave requires_grad_
    reshape reshape_as resize_ resize_as_ resize_as_sparse_ resolve_conj resolve_neg roll rot90 round round_
    row_indices rsqrt rsqrt_ scatter scatter_ scatter_add scatter_add_ scatter_reduce scatter_reduce_ select
    select_scatter set_ sgn sgn_ short sigmoid sigmoid_ sign sign_ signbit sin sin_ sinc sinc_ sinh sinh_
    slice_inverse slice_scatter smm softmax sparse_mask sparse_resize_ sparse_resize_and_clear_ sqrt sqrt_
    square square_ squeeze squeeze_ sspaddmm std sub sub_ subtract subtract_ sum sum_to_size swapaxes
    swapaxes_ swapdims swapdims_ t t_ take take_along_dim tan tan_ tanh tanh_ tile to to_dense to_mkldnn
    to_padded_tensor to_sparse to_sparse_bsc to_sparse_bsr to_sparse_csc to_sparse_csr trace transpose
    transpose_ tril tril_ triu triu_ true_divide true_divide_ trunc trunc_ type_as unflatten unfold uniform_
    unsqueeze unsqueeze_ values var vdot view view_as where xlogy xlogy_ xpu zero_""".split()
)

# `tensor.<name>(...)` is a tuple or list of tensors (every overload).
TENSOR_METHODS_SEQUENCE = frozenset(
    """chunk dsplit hsplit split split_with_sizes tensor_split unbind unsafe_chunk unsafe_split
    unsafe_split_with_sizes vsplit""".split()
)

# `tensor.<name>` is a tensor (every overload).
TENSOR_ATTRIBUTES = frozenset(
    """H T data imag mH mT real""".split()
)
