# syntax=docker/dockerfile:1
# mme builder for SageMaker training jobs (`mme package --catalogue FILE --on sagemaker`): the
# builder image, run as root. A training container gets /opt/ml/input, /opt/ml/model and
# /opt/ml/output mounted for root (a non-root user cannot write the model directory that
# SageMaker uploads), as SageMaker's own training images run. The default builder image stays
# unprivileged for `docker run` on a GPU host.
#   make docker-build-job   (= docker build -f docker/builder/job.Dockerfile --build-arg BUILDER_IMAGE=mme-builder:25.09 \
#                              -t mme-builder:25.09-sagemaker .)
# then push it to ECR and pass it to mme package --on sagemaker --image-uri.

ARG BUILDER_IMAGE=mme-builder:25.09
FROM ${BUILDER_IMAGE}
LABEL io.mme.use="sagemaker-training-job"
# hadolint ignore=DL3002
USER 0
